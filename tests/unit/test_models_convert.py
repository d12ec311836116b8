"""The BERT → GGUF converter on a tiny synthetic checkpoint: metadata, vocabulary, tensor
names, shapes and types as llama.cpp's convert_hf_to_gguf.py writes them, deterministically."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file

from models import BERT_TOKENIZER_PRE, ConversionError, convert_bert_to_gguf
from supervisor.gguf._check import read_gguf_info, sha256_file
from tests.support.models import (
    FFN,
    HEADS,
    HIDDEN,
    LAYERS,
    POSITIONS,
    SPECIALS,
    VOCAB,
    bert_tensors,
    write_tiny_bert,
)


def fields(path: Path) -> dict[str, Any]:
    reader = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    write_tiny_bert(tmp_path / "model")
    return tmp_path / "model"


def test_metadata_matches_the_reference_converter(checkpoint: Path, tmp_path: Path) -> None:
    """Hyperparameters, pooling, attention and file type are written as BertModel writes them."""
    out = tmp_path / "m.gguf"
    convert_bert_to_gguf(checkpoint, out, model_name="tiny-bert")
    kv = fields(out)
    assert kv["general.architecture"] == "bert"
    assert kv["general.type"] == "model"
    assert kv["general.name"] == "tiny-bert"
    assert kv["bert.block_count"] == LAYERS
    assert kv["bert.context_length"] == POSITIONS
    assert kv["bert.embedding_length"] == HIDDEN
    assert kv["bert.feed_forward_length"] == FFN
    assert kv["bert.attention.head_count"] == HEADS
    assert kv["bert.attention.layer_norm_epsilon"] == pytest.approx(1e-12)
    assert kv["bert.attention.causal"] is False
    assert kv["bert.pooling_type"] == int(gguf.PoolingType.MEAN)
    assert kv["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_F16)
    assert kv["general.quantization_version"] == gguf.GGML_QUANT_VERSION
    info = read_gguf_info(out)
    assert (info.architecture, info.context_length, info.embedding_length) == ("bert", 16, 8)
    assert info.file_type == "F16"


def test_vocabulary_uses_phantom_spaces(checkpoint: Path, tmp_path: Path) -> None:
    """WordPiece pieces get the U+2581 word marker, "##" pieces lose it, specials stay."""
    out = tmp_path / "m.gguf"
    convert_bert_to_gguf(checkpoint, out)
    kv = fields(out)
    assert kv["tokenizer.ggml.model"] == "bert"
    assert kv["tokenizer.ggml.pre"] == BERT_TOKENIZER_PRE
    assert kv["tokenizer.ggml.token_type_count"] == 2
    tokens = kv["tokenizer.ggml.tokens"]
    assert tokens[:6] == ["[PAD]", "\u2581[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tokens[6:9] == ["\u2581the", "\u2581cat", "\u2581sat"]
    assert tokens[VOCAB.index("##s")] == "s"
    control, normal = int(gguf.TokenType.CONTROL), int(gguf.TokenType.NORMAL)
    expected_types = [control if i in SPECIALS.values() else normal for i in range(len(VOCAB))]
    assert kv["tokenizer.ggml.token_type"] == expected_types


def test_special_tokens_and_normalizer(checkpoint: Path, tmp_path: Path) -> None:
    """CLS/SEP become BOS/EOS, both added; UNK, PAD, MASK ids and lowercasing are recorded."""
    out = tmp_path / "m.gguf"
    convert_bert_to_gguf(checkpoint, out)
    kv = fields(out)
    assert kv["tokenizer.ggml.bos_token_id"] == SPECIALS["cls"]
    assert kv["tokenizer.ggml.eos_token_id"] == SPECIALS["sep"]
    assert kv["tokenizer.ggml.seperator_token_id"] == SPECIALS["sep"]
    assert kv["tokenizer.ggml.unknown_token_id"] == SPECIALS["unk"]
    assert kv["tokenizer.ggml.padding_token_id"] == SPECIALS["pad"]
    assert kv["tokenizer.ggml.mask_token_id"] == SPECIALS["mask"]
    assert kv["tokenizer.ggml.add_bos_token"] is True
    assert kv["tokenizer.ggml.add_eos_token"] is True
    assert kv["tokenizer.ggml.add_sep_token"] is False
    assert kv["tokenizer.ggml.normalizer.lowercase"] is True
    assert "tokenizer.ggml.normalizer.strip_accents" not in kv  # null: follows lowercase


def expected_tensors() -> dict[str, tuple[list[int], gguf.GGMLQuantizationType]]:
    """GGUF name → (ggml shape, type) that the reference writes with --outtype f16."""
    f16, f32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
    want = {
        "token_embd.weight": ([HIDDEN, len(VOCAB)], f16),
        "position_embd.weight": ([HIDDEN, POSITIONS], f32),
        "token_types.weight": ([HIDDEN, 2], f32),
        "token_embd_norm.weight": ([HIDDEN], f32),
        "token_embd_norm.bias": ([HIDDEN], f32),
    }
    for i in range(LAYERS):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            want[f"blk.{i}.{name}.weight"] = ([HIDDEN, HIDDEN], f16)
            want[f"blk.{i}.{name}.bias"] = ([HIDDEN], f32)
        for norm in ("attn_output_norm", "layer_output_norm"):
            want[f"blk.{i}.{norm}.weight"] = ([HIDDEN], f32)
            want[f"blk.{i}.{norm}.bias"] = ([HIDDEN], f32)
        want[f"blk.{i}.ffn_up.weight"] = ([HIDDEN, FFN], f16)
        want[f"blk.{i}.ffn_up.bias"] = ([FFN], f32)
        want[f"blk.{i}.ffn_down.weight"] = ([FFN, HIDDEN], f16)
        want[f"blk.{i}.ffn_down.bias"] = ([HIDDEN], f32)
    return want


@pytest.mark.parametrize(
    ("prefix", "old_norm_names"), [("", False), ("bert.", True)], ids=["plain", "bert-prefix-gamma"]
)
def test_tensor_names_shapes_and_types(tmp_path: Path, prefix: str, old_norm_names: bool) -> None:
    """Every kept tensor maps to its GGUF name; matrices are F16, vectors and embeddings F32."""
    source = write_tiny_bert(tmp_path / "model", prefix=prefix, old_norm_names=old_norm_names)
    out = tmp_path / "m.gguf"
    convert_bert_to_gguf(tmp_path / "model", out)
    reader = gguf.GGUFReader(out)
    got = {t.name: ([int(d) for d in t.shape], t.tensor_type) for t in reader.tensors}
    assert got == expected_tensors()  # position_ids and the pooler are gone
    data = {t.name: np.asarray(t.data) for t in reader.tensors}
    words = source[prefix + "embeddings.word_embeddings.weight"]
    assert np.array_equal(data["token_embd.weight"], words.astype(np.float16))
    bias = source[prefix + "encoder.layer.1.output.dense.bias"]
    assert np.array_equal(data["blk.1.ffn_down.bias"], bias)


def test_vocab_txt_without_tokenizer_json(tmp_path: Path) -> None:
    """With only vocab.txt the special tokens still become CONTROL; only PAD's id is known."""
    write_tiny_bert(tmp_path / "model", tokenizer_json=False)
    out = tmp_path / "m.gguf"
    convert_bert_to_gguf(tmp_path / "model", out)
    kv = fields(out)
    types = kv["tokenizer.ggml.token_type"]
    assert [i for i, t in enumerate(types) if t == gguf.TokenType.CONTROL] == [0, 2, 3, 4, 5]
    assert kv["tokenizer.ggml.tokens"][7] == "\u2581cat"
    assert kv["tokenizer.ggml.padding_token_id"] == 0  # from config.json pad_token_id
    assert "tokenizer.ggml.bos_token_id" not in kv  # llama.cpp's BERT defaults apply
    assert "tokenizer.ggml.normalizer.lowercase" not in kv


def test_output_is_deterministic(checkpoint: Path, tmp_path: Path) -> None:
    """Converting the same checkpoint twice gives byte-identical files."""
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    convert_bert_to_gguf(checkpoint, first, model_name="tiny")
    convert_bert_to_gguf(checkpoint, second, model_name="tiny")
    assert sha256_file(first) == sha256_file(second)


def test_refuses_other_architectures(checkpoint: Path, tmp_path: Path) -> None:
    """A config that is not a BERT model is refused before anything is written."""
    config = json.loads((checkpoint / "config.json").read_text())
    config["architectures"] = ["RobertaModel"]
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match="not a supported BERT"):
        convert_bert_to_gguf(checkpoint, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_refuses_unknown_tensors(checkpoint: Path, tmp_path: Path) -> None:
    """A tensor with no GGUF BERT name is an error, not silently dropped."""
    tensors = bert_tensors()
    tensors["encoder.extra.weight"] = np.zeros((2, 2), dtype=np.float32)
    save_file(tensors, str(checkpoint / "model.safetensors"))
    expected = re.escape("cannot map tensor 'encoder.extra.weight'")
    with pytest.raises(ConversionError, match=expected):
        convert_bert_to_gguf(checkpoint, tmp_path / "m.gguf")


def test_refuses_missing_weights(checkpoint: Path, tmp_path: Path) -> None:
    """A checkpoint without safetensors files is refused with a clear message."""
    (checkpoint / "model.safetensors").unlink()
    with pytest.raises(ConversionError, match=re.escape("no model*.safetensors")):
        convert_bert_to_gguf(checkpoint, tmp_path / "m.gguf")


@pytest.mark.process
def test_converter_imports_neither_torch_nor_transformers(checkpoint: Path, tmp_path: Path) -> None:
    """A conversion in a fresh interpreter never imports torch or transformers."""
    code = (
        "import sys\n"
        "from models import convert_bert_to_gguf\n"
        "convert_bert_to_gguf(sys.argv[1], sys.argv[2])\n"
        "print(','.join(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code, str(checkpoint), str(tmp_path / "m.gguf")],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == ""
    assert (tmp_path / "m.gguf").stat().st_size > 0
