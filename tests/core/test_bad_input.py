"""Bad checkpoints and bad prompts get one clear error naming the file, tensor or limit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import tileinfer
from tileinfer.errors import CheckpointError, ConfigError, UsageError
from conftest import REFERENCE_CPU as BASE


def engine_for(folder: Path, *extra: str):
    return tileinfer.Engine.from_config(model=str(folder), overrides=[*BASE, *extra], progress=False)


@pytest.fixture
def copy_of(tmp_path, tiny_checkpoint):
    def make(source: Path | None = None) -> Path:
        target = tmp_path / "ckpt"
        shutil.copytree(source or tiny_checkpoint, target)
        return target
    return make


def test_missing_folder():
    with pytest.raises(ConfigError, match="model folder not found: /no/where"):
        engine_for(Path("/no/where"))


def _delete(name: str):
    def edit(folder: Path) -> None:
        (folder / name).unlink()
    return edit


def _set_config(**keys):
    def edit(folder: Path) -> None:
        _edit_json(folder / "config.json", lambda raw: raw.update(keys))
    return edit


def _write_weights(cut):
    """Replace model.safetensors' bytes by ``cut(bytes)``."""
    def edit(folder: Path) -> None:
        path = folder / "model.safetensors"
        path.write_bytes(cut(path.read_bytes()))
    return edit


def _edit_json(path: Path, edit) -> None:
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


# How a copy of the tiny checkpoint is broken, and the one CheckpointError line loading it raises.
BROKEN = {
    "missing config.json": (_delete("config.json"), r"config\.json: missing"),
    "unsupported architecture": (_set_config(model_type="llama", architectures=["LlamaForCausalLM"]),
                                 "unsupported architecture.*LlamaForCausalLM"),
    "corrupt safetensors": (_write_weights(lambda data: b"\x00garbage" * 10),
                            r"model\.safetensors: cannot read safetensors"),
    "truncated safetensors": (_write_weights(lambda data: data[: len(data) // 2]), r"model\.safetensors"),
    "no weights": (_delete("model.safetensors"), r"no model\.safetensors or model\.safetensors\.index\.json"),
    "a shape that does not match the config": (_set_config(intermediate_size=136),  # 128 in the checkpoint
                                               r"model\.safetensors: tensor model\.layers\.0\.mlp\.gate_proj\.weight "
                                               r"has shape \(128, 64\), config\.json implies \(136, 64\)"),
}


@pytest.mark.parametrize("broken", BROKEN)
def test_a_broken_checkpoint_is_one_checkpoint_error(copy_of, broken):
    edit, message = BROKEN[broken]
    folder = copy_of()
    edit(folder)
    with pytest.raises(CheckpointError, match=message):
        engine_for(folder)


def test_missing_tensor_and_missing_shard(tmp_path, checkpoint_factory):
    sharded = checkpoint_factory(shard=True)
    folder = tmp_path / "a"
    shutil.copytree(sharded, folder)
    _edit_json(folder / "model.safetensors.index.json", lambda index: index["weight_map"].pop("model.norm.weight"))
    with pytest.raises(CheckpointError, match=r"tensor model\.norm\.weight is missing"):
        engine_for(folder)
    folder = tmp_path / "b"
    shutil.copytree(sharded, folder)
    shard = sorted(folder.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"lists shard {shard.name}, which is missing"):
        engine_for(folder)


def test_unknown_key_and_unknown_name(tiny_checkpoint):
    with pytest.raises(ConfigError, match="unknown config key 'lineaar'"):
        engine_for(tiny_checkpoint, "lineaar=reference")
    with pytest.raises(ConfigError, match="linear=fast: no plugin registered that name; valid: auto, reference, triton$"):
        engine_for(tiny_checkpoint, "linear=fast")
    with pytest.raises(ConfigError, match="proposer=fast: no plugin registered that name; valid: none, dflash, draft, ngram$"):
        engine_for(tiny_checkpoint, "proposer=fast")


def test_bad_options_fail_before_loading(tiny_checkpoint, monkeypatch):
    """Every option is typed and checked, and each chosen implementation says why it cannot run,
    before a weight is read."""
    import tileinfer.checkpoint

    monkeypatch.setattr(tileinfer.checkpoint, "CheckpointReader", None)  # loading would raise TypeError
    cases = {
        "options.ngram.n_max=abc": "options.ngram.n_max=abc is not valid: expected an integer",
        "options.ngram.n_max=0": "options.ngram.n_max=0 is not valid: must be >= 1",
        "options.ngram.k=3": "options.ngram.k is not an option of ngram; valid: n_min, n_max",
        "options.triton.attend=flash": "options.triton.attend=flash is not valid; choose one of: paged, dense",
        "options.triton.pdl=3": "options.triton.pdl=3 is not valid: expected true or false",
        "options.paged.x=1": "options.paged.x is not an option of paged; valid: \\(it takes none\\)",
        "options.fast.x=1": "options.fast: no implementation has that name",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            engine_for(tiny_checkpoint, override)
    with pytest.raises(ConfigError, match="n_min \\(5\\) is larger than options.ngram.n_max \\(4\\)"):
        engine_for(tiny_checkpoint, "proposer=ngram", "options.ngram.n_min=5")
    with pytest.raises(ConfigError, match="linear=triton cannot run here: options.triton.matmul=torch runs the SwiGLU and residual add as kernels"):
        engine_for(tiny_checkpoint, "linear=triton", "options.triton.matmul=torch")


def test_options_of_an_unselected_implementation_are_a_notice(tiny_checkpoint, caplog):
    """Options for an implementation no interface selects change nothing: the run says so."""
    from tileinfer.config import load_config
    from tileinfer.resolution import ResolvedConfig

    def notices(*overrides: str) -> list[str]:
        caplog.clear()
        with caplog.at_level("WARNING", logger="tileinfer"):
            ResolvedConfig.of(load_config(overrides=[*BASE, f"model={tiny_checkpoint}", *overrides]))
        return [r.getMessage() for r in caplog.records if "has no effect" in r.getMessage()]

    assert notices("options.triton.int8_convert=permute", "options.ngram.n_max=5") == [
        "options.triton (int8_convert) has no effect: triton is not selected here "
        "(linear=reference, attention=reference)",
        "options.ngram (n_max) has no effect: ngram is not selected here (proposer=none)"]
    assert notices("proposer=ngram", "options.ngram.n_max=5") == []


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return engine_for(tiny_checkpoint, "kv_capacity=64")


def test_empty_prompt(engine):
    with pytest.raises(UsageError, match="the prompt is empty"):
        engine.generate([])
    with pytest.raises(UsageError, match="the prompt is empty"):
        engine.generate("")


def test_token_ids_outside_the_vocabulary(engine):
    with pytest.raises(UsageError, match=r"token id 320 is outside the vocabulary \[0, 320\)"):
        engine.generate([1, 2, 320])
    with pytest.raises(UsageError, match="token id -1"):
        engine.generate([-1])


def test_prompt_longer_than_the_kv_capacity(engine):
    with pytest.raises(UsageError, match=r"needs 70 positions, more than kv_capacity \(64\)"):
        engine.generate(list(range(60)), max_new_tokens=10)
    assert len(engine.generate(list(range(54)), max_new_tokens=10).token_ids) == 10  # exactly fits


def test_prompt_longer_than_the_model_positions(checkpoint_factory):
    folder = checkpoint_factory(max_positions=48)
    engine = engine_for(folder)
    with pytest.raises(UsageError, match=r"more than the model's context \(48\)"):
        engine.generate(list(range(40)), max_new_tokens=10)


def test_chat_without_a_template(copy_of):
    folder = copy_of()
    for name in ("chat_template.jinja",):
        (folder / name).unlink(missing_ok=True)
    _edit_json(folder / "tokenizer_config.json", lambda raw: raw.pop("chat_template", None))
    with pytest.raises(UsageError, match="no chat template"):
        engine_for(folder).generate("hi", chat=True)


def test_text_prompt_without_a_tokenizer(copy_of):
    folder = copy_of()
    (folder / "tokenizer.json").unlink()
    engine = engine_for(folder)
    with pytest.raises(UsageError, match="no tokenizer.json"):
        engine.generate("hello")
    assert engine.generate([1, 2, 3], max_new_tokens=2).text is None


def test_no_model_and_no_shipped_model(monkeypatch):
    """An install without the shipped models (their folder gone) and no --model: a clear error."""
    import tileinfer.checkpoint

    monkeypatch.setattr(tileinfer.checkpoint, "shipped_model", lambda: None)
    with pytest.raises(ConfigError, match="no model given.*models/target is not installed"):
        tileinfer.Engine.from_config(overrides=BASE, progress=False)


def test_no_model_given_uses_the_shipped_target():
    folder = tileinfer.shipped_model()
    assert folder is not None and (folder / "config.json").is_file()  # models/target is committed
    engine = tileinfer.Engine.from_config(overrides=BASE, progress=False)
    assert engine.model_config.num_layers == 6 and engine.model_config.vocab_size == 8192
