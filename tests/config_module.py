"""A user's own configuration module, as ``import config`` beside a script gives one: tests/test_module_values.py
reads its attributes from graphed functions and changes them between calls."""

SCALE = 1.0
TABLE = {"shift": [0.0]}


class Knobs:
    temp = 1.0
