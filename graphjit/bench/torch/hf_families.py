"""Random-weight transformers models of several families, built from their configs (nothing downloaded): what
``bench generate``, ``examples/hf_generate.py`` and the generation tests (tests/test_graph_generation.py,
tests/test_gpu_generation.py) run.  torch and transformers are passed in, not imported here."""

from __future__ import annotations

from typing import Any

COMMON = {"vocab_size": 256, "max_position_embeddings": 256, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
DECODERS: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {},
    "mistral": {"sliding_window": None},
    "qwen3": {"head_dim": 32},
    "phi3": {},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                  "shared_expert_intermediate_size": 128},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "gpt2": {},
    "gemma2": {"head_dim": 32, "sliding_window": 16},
    "gemma3_text": {"head_dim": 32, "sliding_window": 16},
}
SLIDING = ("gemma2", "gemma3_text")
"""Families whose sliding-window cache layers count their length in a Python int (see the generation tests)."""
MULTIMODAL = ("qwen2_vl",)
"""Vision-language models whose text decoder generates from a text-only prompt (the vision tower is built and not
run): Qwen2-VL's decoder takes 3-axis rotary positions (M-RoPE), computed in its prefill and kept on the model."""
FAMILIES = (*DECODERS, *MULTIMODAL, "t5")
"""Every family :func:`build` makes."""
_OUT_OF_VOCAB = 300
"""Special token ids of the multimodal families: above the vocabulary, so no random prompt holds one."""


def build(torch: Any, transformers: Any, family: str, layers: int = 2, hidden: int = 128, device: str = "cpu",
          dtype: Any = None, sliding_window: int | None = 16) -> Any:
    """``family``'s model (one of :data:`FAMILIES`), eval mode, seeded weights.

    ``sliding_window``: of the :data:`SLIDING` families; 16 (the tests' default) fills during a short generation, so
    both branches of their cache layers run; None keeps the config's own (4096 in transformers 5), which a
    generation of fewer tokens never fills, as with the released models."""
    torch.manual_seed(0)
    if family == "t5":
        config = transformers.T5Config(vocab_size=256, d_model=hidden, d_kv=hidden // 4, d_ff=2 * hidden,
                                       num_layers=layers, num_heads=4, decoder_start_token_id=0, pad_token_id=0,
                                       eos_token_id=1)
        model = transformers.T5ForConditionalGeneration(config)
    elif family == "qwen2_vl":
        half = hidden // 8  # of the head dim (4 heads): M-RoPE's time, height and width sections add up to it
        text = {**COMMON, "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
                "num_attention_heads": 4, "num_key_value_heads": 2,
                "rope_scaling": {"type": "mrope", "mrope_section": [half // 2, half // 4, half // 4]}}
        vision = {"depth": 1, "embed_dim": 32, "num_heads": 2, "hidden_size": hidden}
        config = transformers.Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=_OUT_OF_VOCAB,
                                            video_token_id=_OUT_OF_VOCAB + 1,
                                            vision_start_token_id=_OUT_OF_VOCAB + 2)
        model = transformers.Qwen2VLForConditionalGeneration(config)
    elif family == "gpt2":
        config = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=4, vocab_size=256, n_positions=256,
                                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
        model = transformers.GPT2LMHeadModel(config)
    else:
        kwargs = {**COMMON, "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
                  "num_attention_heads": 4, "num_key_value_heads": 2, **DECODERS[family]}
        if family in SLIDING and sliding_window is None:
            del kwargs["sliding_window"]
        config = transformers.AutoConfig.for_model(family, **kwargs)
        model = transformers.AutoModelForCausalLM.from_config(config)
    model = model.to(device)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()
