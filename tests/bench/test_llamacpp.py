"""``python -m bench llamacpp``: llama-bench's JSON tests as matrix records of peers llama.cpp and
llama.cpp-q8_0, and the Q8_0 GGUF the converter writes, read back with gguf-py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bench import llamacpp
from conftest import ROOT

LIMITS = {"copy_bandwidth_tb_s": 4.0, "matmul_peak_tflops": 800.0}


def test_llama_bench_tests_become_matrix_records():
    tests = [{"n_prompt": 1024, "n_gen": 0, "n_depth": 0, "avg_ts": 32000.0, "build_commit": "abc"},
             {"n_prompt": 1024, "n_gen": 0, "n_depth": 1024, "avg_ts": 30000.0},  # not a matrix row
             {"n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ts": 300.0, "samples_ts": [299.0, 300.0, 301.0]},
             {"n_prompt": 0, "n_gen": 128, "n_depth": 1024, "avg_ts": 280.0}]
    rows = llamacpp.rows(tests, "Qwen3-4B", "llama.cpp", LIMITS)
    assert [(r["workload"], r["unit"]) for r in rows] == [
        ("prefill1024", "ms"), ("decode128_ctx0", "tok/s"), ("decode128_ctx1024", "tok/s")]
    assert all(r["peer"] == "llama.cpp" and r["variant"] is None and r["shape"] == "Qwen3-4B" for r in rows)
    assert rows[0]["value"] == pytest.approx(1024 / 32000 * 1e3)
    assert 0 < rows[0]["peak_fraction"] < 1 and rows[0]["tflops"] == pytest.approx(rows[0]["peak_fraction"] * 800)
    assert rows[1]["samples"] == [299.0, 300.0, 301.0]
    # the same bytes per step as our own rows: 4B BF16 is ~8 GB a step, ~500 tok/s at 4 TB/s
    assert rows[2]["roofline_fraction"] == pytest.approx(280 / rows[2]["roofline_tok_s"])
    assert 400 < rows[2]["roofline_tok_s"] < 600


def test_q8_0_records_are_the_llama_cpp_q8_0_peer_with_an_int8_roofline():
    decode = {"n_prompt": 0, "n_gen": 128, "n_depth": 1024, "avg_ts": 290.0}
    [bf16] = llamacpp.rows([{**decode, "model_type": "qwen3 0.6B BF16"}], "Qwen3-0.6B", "llama.cpp", LIMITS)
    [q8] = llamacpp.rows([{**decode, "model_type": "qwen3 0.6B Q8_0"}], "Qwen3-0.6B", "llama.cpp-q8_0", LIMITS)
    assert (q8["shape"], q8["peer"], q8["workload"]) == ("Qwen3-0.6B", "llama.cpp-q8_0", "decode128_ctx1024")
    # INT8 weights: the weights' bytes about halve, so the roofline nearly doubles (the KV stays BF16)
    assert 1.5 < q8["roofline_tok_s"] / bf16["roofline_tok_s"] < 2.0
    with pytest.raises(ValueError, match="measured a bf16 model, not the llama.cpp-q8_0"):
        llamacpp.rows([{**decode, "model_type": "qwen3 4B BF16"}], "Qwen3-4B", "llama.cpp-q8_0", LIMITS)


@pytest.fixture(scope="module")
def llama_cpp_tree(tmp_path_factory) -> Path:
    """The converter and gguf-py of the vendored llama.cpp tree that ``python -m bench llamacpp prepare``
    packs (.peer/llama.cpp.tgz, not in git: skipped where it was not prepared)."""
    import tarfile

    archive = ROOT / ".peer" / "llama.cpp.tgz"
    if not archive.is_file():
        pytest.skip(f"{archive} is missing: run 'python -m bench llamacpp prepare' (needs the package index)")
    out = tmp_path_factory.mktemp("llama")
    wanted = ("llama.cpp/convert_hf_to_gguf.py", "llama.cpp/conversion/", "llama.cpp/gguf-py/")
    with tarfile.open(archive) as tar:
        tar.extractall(out, members=[m for m in tar if m.name.startswith(wanted)], filter="data")
    return out / "llama.cpp"


def test_q8_0_gguf_round_trips_through_gguf_py(llama_cpp_tree, tmp_path, monkeypatch):
    """A save_pretrained checkpoint (non-default sizes, the shipped tokenizer's 8,192 ids) written
    as Q8_0 by bench/llamacpp.py and read back with gguf-py's reader: every 2-D weight Q8_0
    at its shape, the norms float32, the dequantized values within Q8_0's rounding of the source."""
    from safetensors.torch import load_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, vocab_size=8192, rms_norm_eps=1e-5,
                         max_position_embeddings=512, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():  # norms away from their all-ones init, so that a lost value shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand_like(p) + 0.5)
    folder = tmp_path / "ckpt"
    model.save_pretrained(folder)
    llamacpp.convert(folder, llama_cpp_tree, tmp_path / "m.gguf", "q8_0")

    monkeypatch.syspath_prepend(str(llama_cpp_tree / "gguf-py"))  # the tree's gguf-py, for this test only
    import gguf

    assert Path(gguf.__file__).is_relative_to(llama_cpp_tree)
    source = {k: v.float().numpy() for k, v in load_file(folder / "model.safetensors").items()}
    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}
    per_layer = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
                 "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    names |= {f"blk.{i}.{g}": f"model.layers.{i}.{h}" for i in range(2) for g, h in per_layer.items()}
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    tensors = {t.name.removesuffix(".weight"): t for t in reader.tensors}
    assert set(tensors) == set(names)  # the tied lm_head is the token embedding
    for gguf_name, hf_name in names.items():
        t, w = tensors[gguf_name], source[hf_name + ".weight"]
        assert [int(d) for d in reversed(t.shape)] == list(w.shape), gguf_name  # ggml lists dims innermost first
        if w.ndim == 1:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, gguf_name
            np.testing.assert_array_equal(t.data, w)
            continue
        assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0, gguf_name
        assert t.data.nbytes == w.size // 32 * 34  # 32 int8 values and a float16 scale a block
        back = gguf.quants.dequantize(t.data, t.tensor_type).reshape(w.shape)
        block_max = np.abs(w.reshape(-1, 32)).max(axis=1, keepdims=True)
        # half a step of amax / 127, plus the float16 scale's rounding over 127 steps
        err = np.abs(back - w).reshape(-1, 32)
        assert (err <= block_max * (0.5 / 127 + 2**-10) + 1e-12).all(), gguf_name
        assert err.max() > 0  # quantized, not copied
