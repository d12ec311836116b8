"""Tiny model files built in the test: a valid GGUF, and a sentence-transformers style BERT
checkpoint to convert."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import save_file


def write_model(path: Path, *, vocab: int = 300, architecture: str = "llama",
                pooling: int | None = None) -> Path:
    """Write a small valid GGUF: metadata, a string-array vocabulary and three tensors (of
    ``architecture``, with ``{architecture}.pooling_type`` = ``pooling`` when given)."""
    writer = gguf.GGUFWriter(path, architecture)
    if pooling is not None:
        writer.add_pooling_type(gguf.PoolingType(pooling))
    writer.add_name("tiny test model")
    writer.add_context_length(256)
    writer.add_embedding_length(8)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_token_list([f"tok{i}" for i in range(vocab)])
    writer.add_token_scores([0.0] * vocab)
    writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    # Quantized tensors given as raw blocks: 2 rows of one Q8_0 block (34 bytes each),
    # 1 row of one Q4_K super-block (144 bytes).
    q8 = np.zeros((2, 34), dtype=np.uint8)
    writer.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    q4k = np.zeros((1, 144), dtype=np.uint8)
    writer.add_tensor("blk.0.ffn_up.weight", q4k, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


HIDDEN, HEADS, LAYERS, FFN, POSITIONS = 8, 2, 2, 16, 16
VOCAB = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on",
         "mat", "##s", "dog", "a", ".", "rug"]  # fmt: skip
SPECIALS = {"pad": 0, "unk": 2, "cls": 3, "sep": 4, "mask": 5}


def bert_tensors(*, prefix: str = "", old_norm_names: bool = False) -> dict[str, np.ndarray]:
    """Random weights named like Hugging Face BertModel's, plus tensors the converter drops."""
    rng = np.random.default_rng(0)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    norm_w, norm_b = ("gamma", "beta") if old_norm_names else ("weight", "bias")
    t = {
        "embeddings.word_embeddings.weight": rand(len(VOCAB), HIDDEN),
        "embeddings.position_embeddings.weight": rand(POSITIONS, HIDDEN),
        "embeddings.token_type_embeddings.weight": rand(2, HIDDEN),
        f"embeddings.LayerNorm.{norm_w}": rand(HIDDEN),
        f"embeddings.LayerNorm.{norm_b}": rand(HIDDEN),
        "embeddings.position_ids": np.arange(POSITIONS, dtype=np.int64).reshape(1, POSITIONS),
        "pooler.dense.weight": rand(HIDDEN, HIDDEN),
        "pooler.dense.bias": rand(HIDDEN),
    }

    def linear(name: str, out: int, into: int) -> None:
        t[f"{name}.weight"] = rand(out, into)
        t[f"{name}.bias"] = rand(out)

    def layer_norm(name: str) -> None:
        t[f"{name}.{norm_w}"] = rand(HIDDEN)
        t[f"{name}.{norm_b}"] = rand(HIDDEN)

    for i in range(LAYERS):
        layer = f"encoder.layer.{i}"
        for proj in ("query", "key", "value"):
            linear(f"{layer}.attention.self.{proj}", HIDDEN, HIDDEN)
        linear(f"{layer}.attention.output.dense", HIDDEN, HIDDEN)
        layer_norm(f"{layer}.attention.output.LayerNorm")
        linear(f"{layer}.intermediate.dense", FFN, HIDDEN)
        linear(f"{layer}.output.dense", HIDDEN, FFN)
        layer_norm(f"{layer}.output.LayerNorm")
    return {prefix + name: value for name, value in t.items()}


def _dump(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def write_tiny_bert(
    model_dir: Path,
    *,
    tokenizer_json: bool = True,
    prefix: str = "",
    old_norm_names: bool = False,
) -> dict[str, np.ndarray]:
    """Write a sentence-transformers style BERT checkpoint; return its tensors."""
    model_dir.mkdir(parents=True, exist_ok=True)
    _dump(
        model_dir / "config.json",
        {
            "architectures": ["BertModel"],
            "hidden_size": HIDDEN,
            "num_attention_heads": HEADS,
            "num_hidden_layers": LAYERS,
            "intermediate_size": FFN,
            "max_position_embeddings": POSITIONS,
            "layer_norm_eps": 1e-12,
            "type_vocab_size": 2,
            "vocab_size": len(VOCAB),
            "pad_token_id": 0,
            "model_type": "bert",
        },
    )
    tensors = bert_tensors(prefix=prefix, old_norm_names=old_norm_names)
    save_file(tensors, str(model_dir / "model.safetensors"))
    (model_dir / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB), encoding="utf-8")
    names = {f"{k}_token": VOCAB[v] for k, v in SPECIALS.items()}
    _dump(model_dir / "special_tokens_map.json", names)
    _dump(model_dir / "tokenizer_config.json", {"do_lower_case": True, **names})
    _dump(
        model_dir / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {
                "idx": 1,
                "name": "1",
                "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling",
            },
        ],
    )
    _dump(
        model_dir / "1_Pooling" / "config.json",
        {"word_embedding_dimension": HIDDEN, "pooling_mode_cls_token": False,
         "pooling_mode_mean_tokens": True},
    )  # fmt: skip
    if tokenizer_json:
        cls_sep = [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "[SEP]", "type_id": 0}}]  # fmt: skip
        pair = [*cls_sep, {"Sequence": {"id": "B", "type_id": 1}},
                {"SpecialToken": {"id": "[SEP]", "type_id": 1}}]  # fmt: skip
        _dump(
            model_dir / "tokenizer.json",
            {
                "version": "1.0",
                "added_tokens": [
                    {"id": i, "content": VOCAB[i], "special": True, "normalized": False}
                    for i in sorted(SPECIALS.values())
                ],
                "normalizer": {"type": "BertNormalizer", "lowercase": True, "strip_accents": None},
                "pre_tokenizer": {"type": "BertPreTokenizer"},
                "post_processor": {"type": "TemplateProcessing", "single": cls_sep, "pair": pair},
                "model": {
                    "type": "WordPiece",
                    "unk_token": "[UNK]",
                    "continuing_subword_prefix": "##",
                    "vocab": {t: i for i, t in enumerate(VOCAB)},
                },
            },
        )
    return tensors
