"""What ``@graphed`` and ``graphed_layer`` decide alike: strict mode, verify, the key limit (``max_graphs``),
messages said once, and the checks of the options they share.

:class:`Policy` is the base of both (``graphjit.api._State`` and ``graphjit.training.core.GraphedLayerCore``):
an option given to the decorator wins over its ``GRAPHJIT_*`` variable, read at the call (so that
``graphjit.refresh_env()`` takes effect), which wins over the default.  The ``check_*`` functions raise a
:class:`~graphjit.errors.ConfigError` naming the option and what it accepts.
"""

from __future__ import annotations

import logging
from typing import Any

from . import env
from .errors import CaptureError, ConfigError

log = logging.getLogger("graphjit")

DEFAULT_MAX_GRAPHS = 64


class Policy:
    """Strict, verify, max_graphs and once-only messages of one graphed function or layer."""

    def __init__(self, name: str, strict: bool | None, verify: bool | None, max_graphs: int | None) -> None:
        self.name = name
        self.strict_option = strict
        self.verify_option = verify
        self.max_graphs_option = max_graphs
        self.said: set[str] = set()

    def strict(self) -> bool:
        return env.settings().strict if self.strict_option is None else self.strict_option

    def verify(self) -> bool:
        return env.settings().verify if self.verify_option is None else self.verify_option

    def max_graphs(self) -> int:
        if self.max_graphs_option is not None:
            return self.max_graphs_option
        from_env = env.settings().max_graphs
        return DEFAULT_MAX_GRAPHS if from_env is None else from_env

    def say_once(self, level: int, topic: str, msg: str, *args: Any) -> None:
        if topic not in self.said:
            self.said.add(topic)
            log.log(level, msg, *args)

    def over_key_limit(self, graphed: int, what: str, fix: str) -> bool:
        """True when ``graphed`` keys already reach ``max_graphs``: a new key then runs uncaptured, said once
        (``what``: what is counted, ``fix``: what to do); strict mode raises :class:`CaptureError` instead."""
        if graphed < self.max_graphs():
            return False
        msg = f"max_graphs={self.max_graphs()} {what} already captured; new ones run uncaptured ({fix})"
        if self.strict():
            raise CaptureError(f"{self.name}: {msg}", reason="max_graphs reached")
        self.say_once(logging.WARNING, "max_graphs", "graphjit %s: %s", self.name, msg)
        return True


def check_flag(name: str, value: Any) -> None:
    """``verify`` / ``strict``: True, False or None (None: from the variable)."""
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r}: expected True, False or None (None: from GRAPHJIT_{name.upper()})")


def check_count(name: str, value: Any, why: str) -> None:
    """An integer >= 1 (``why`` says what it counts)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r}: expected an integer >= 1 ({why})")


def check_max_graphs(value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"max_graphs={value!r}: expected an integer >= 1 or None")


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{name}={value!r}: expected one of {', '.join(repr(a) for a in allowed)}")
