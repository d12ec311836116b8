"""Convert a Hugging Face BERT checkpoint (sentence-transformers style) to an f16 GGUF.

This mirrors what llama.cpp's ``convert_hf_to_gguf.py --outtype f16`` does for
``BertModel`` (``conversion/bert.py`` class ``BertModel`` and its bases ``TextModel`` and
``ModelBase`` in ``conversion/base.py``, llama.cpp as vendored by llama-cpp-python
0.3.36), without torch or transformers: tensors come from ``safetensors`` as numpy
arrays, the WordPiece vocabulary from ``tokenizer.json`` or ``vocab.txt``, and the file
is written by the ``gguf`` package in the same key and tensor order as the reference.

Where the reference needs the Hugging Face tokenizer at run time this module reads the
tokenizer files directly; the two places it cannot reproduce are named where they occur
(the pre-tokenizer hash and the decode/encode round trip of added tokens).

The vocabulary is :mod:`models._bert_vocab`'s part.
The output is deterministic: the same checkpoint and ``gguf`` version give the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors import safe_open

from ._bert_vocab import add_vocab, load_json
from .errors import ConversionError

__all__ = ["BERT_TOKENIZER_PRE", "convert_bert_to_gguf"]

# tokenizer.ggml.pre. The reference derives it by hashing how the Hugging Face tokenizer
# encodes a probe text (TextModel.get_vocab_base_pre). For the uncased BERT WordPiece
# vocabulary (all-MiniLM-L6-v2, bge-small-en-v1.5) the hash is 0876d13b…e19f, which the
# reference maps first to "bert-bge" and then, by a later `if` that wins, to
# "jina-v2-en". llama.cpp only consults the pre-tokenizer for BPE vocabularies
# (llama-vocab.cpp), so for a "bert" (WPM) vocabulary the value is informational.
BERT_TOKENIZER_PRE = "jina-v2-en"

_SUPPORTED_ARCHITECTURES = frozenset({"BertModel", "BertForMaskedLM"})
_ARCH = gguf.MODEL_ARCH.BERT
_FTYPE = gguf.LlamaFileType.MOSTLY_F16

# Tensors the reference keeps in F32 whatever the output type (ModelBase.prepare_tensors).
_F32_TENSOR_KEYS = (
    gguf.MODEL_TENSOR.FFN_GATE_INP,
    gguf.MODEL_TENSOR.POS_EMBD,
    gguf.MODEL_TENSOR.TOKEN_TYPES,
)


def convert_bert_to_gguf(
    model_dir: str | Path,
    out_path: str | Path,
    *,
    model_name: str | None = None,
    tokenizer_pre: str = BERT_TOKENIZER_PRE,
) -> None:
    """Write ``out_path`` as an f16 GGUF of the BERT checkpoint in ``model_dir``.

    2-D weight matrices are stored as F16; 1-D tensors (norms, biases), the position and
    token-type embeddings as F32, as the reference does with ``--outtype f16``. The
    pooler and masked-LM heads and ``embeddings.position_ids`` are dropped.

    Args:
        model_dir: a directory with ``config.json``, ``model*.safetensors``, and
            ``tokenizer.json`` or ``vocab.txt``; optionally ``tokenizer_config.json``,
            ``special_tokens_map.json``, ``modules.json`` with a pooling module, and a
            ``README.md`` model card (its metadata goes into ``general.*``).
        out_path: the file to write (overwritten if present; the caller makes it atomic).
        model_name: ``general.name``; by default the reference's guess from the model
            card and ``config.json``.
        tokenizer_pre: ``tokenizer.ggml.pre``.

    Raises:
        ConversionError: not a supported BERT checkpoint, or files are missing or malformed.
    """
    model_dir = Path(model_dir)
    hparams = load_json(model_dir / "config.json")
    architectures = set(hparams.get("architectures") or [])
    if not architectures & _SUPPORTED_ARCHITECTURES:
        raise ConversionError(
            f"{model_dir}: architectures {sorted(architectures)} are not a supported BERT "
            f"({', '.join(sorted(_SUPPORTED_ARCHITECTURES))})"
        )
    if _has_classifier_labels(hparams):
        raise ConversionError(f"{model_dir}: classification heads are not supported")
    if "text_config" in hparams:
        hparams = {**hparams, **hparams["text_config"]}
    layer_keys = ["n_layers", "num_hidden_layers", "n_layer", "num_layers"]
    block_count = int(_find_hparam(hparams, layer_keys))

    writer = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[_ARCH])
    # Same order as ModelBase.write(): tensors, then metadata (general.*, model
    # parameters, quantization version), then the vocabulary (TextModel.prepare_metadata).
    _add_tensors(writer, model_dir, block_count)
    _add_general_metadata(writer, model_dir, model_name)
    _add_parameters(writer, model_dir, hparams, block_count)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_vocab(writer, model_dir, hparams, tokenizer_pre)

    writer.write_header_to_file(path=Path(out_path))
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()


def _has_classifier_labels(hparams: dict[str, Any]) -> bool:
    """BertModel.__init__: real id2label labels, not AutoConfig's two dummy ones."""
    labels = hparams.get("id2label")
    if not labels or not isinstance(labels, dict):
        return False
    return not (len(labels) == 2 and labels.get("0", labels.get(0)) == "LABEL_0")


def _find_hparam(hparams: dict[str, Any], keys: list[str], *, optional: bool = False) -> Any:
    """ModelBase.find_hparam: the value of the first key present."""
    for key in keys:
        if key in hparams:
            return hparams[key]
    if optional:
        return None
    raise ConversionError(f"config.json has none of {keys}")


# --- tensors ---------------------------------------------------------------------------


def _part_names(model_dir: Path) -> list[str]:
    """ModelBase.get_model_part_names / the index's weight map: the safetensors files."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = load_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ConversionError(f"{index.name} has no weight_map")
        return sorted(set(weight_map.values()))
    names = sorted(
        p.name
        for p in model_dir.iterdir()
        if p.name.startswith("model") and p.suffix == ".safetensors"
    )
    if not names:
        raise ConversionError(f"no model*.safetensors in {model_dir}")
    return names


def _filter_name(name: str) -> str | None:
    """BertModel.filter_tensors and its bases: rename, or None to drop."""
    name = name.removeprefix("bert.")
    if name.endswith(".gamma"):
        name = name[: -len(".gamma")] + ".weight"
    if name.endswith(".beta"):
        name = name[: -len(".beta")] + ".bias"
    # Embeddings only: the pooler and the pre-training heads are not used.
    if name in ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"):
        return None
    if name.startswith(("cls.predictions", "cls.seq_relationship")):
        return None
    if name.endswith("e_score_correction_bias"):
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")
    return name.replace("language_model.", "")


def _iter_tensors(model_dir: Path) -> Iterator[tuple[str, np.ndarray[Any, Any]]]:
    """Yield (renamed name, array) for every kept tensor, parts in order, names sorted."""
    for part in _part_names(model_dir):
        with safe_open(str(model_dir / part), framework="numpy") as f:
            for name in sorted(f.keys()):  # the reference orders by name, as safetensors does
                new_name = _filter_name(name)
                if new_name is None:
                    continue
                try:
                    array = f.get_tensor(name)
                except (TypeError, ValueError) as exc:  # e.g. bfloat16, which numpy lacks
                    raise ConversionError(f"{part}: cannot load {name} as numpy: {exc}") from exc
                yield new_name, array


def _add_tensors(writer: gguf.GGUFWriter, model_dir: Path, block_count: int) -> None:
    tensor_map = gguf.get_tensor_name_map(_ARCH, block_count)
    f32_names = _f32_tensor_names(block_count)
    for name, array in _iter_tensors(model_dir):
        if name.endswith((".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")):
            continue
        data = array if array.dtype in (np.float16, np.float32) else array.astype(np.float32)
        new_name = tensor_map.get_name(key=name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise ConversionError(f"cannot map tensor {name!r} to a GGUF BERT tensor name")
        # 1-D tensors and norms, the listed embeddings, and anything not a weight stay F32.
        if (
            data.ndim <= 1
            or new_name.endswith("_norm.weight")
            or new_name in f32_names
            or new_name[-7:] not in (".weight", ".lora_a", ".lora_b")
        ):
            qtype = gguf.GGMLQuantizationType.F32
        else:
            qtype = gguf.GGMLQuantizationType.F16  # LlamaFileType.MOSTLY_F16
        writer.add_tensor(new_name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


def _f32_tensor_names(block_count: int) -> set[str]:
    names: set[str] = set()
    for key in _F32_TENSOR_KEYS:
        if key not in gguf.MODEL_TENSORS[_ARCH]:
            continue
        template: str = gguf.TENSOR_NAMES[key]
        if "{bid}" in template:
            names.update(template.format(bid=bid) + ".weight" for bid in range(block_count))
        else:
            names.add(template + ".weight")
    return names


# --- metadata --------------------------------------------------------------------------


def _add_general_metadata(writer: gguf.GGUFWriter, model_dir: Path, model_name: str | None) -> None:
    """ModelBase.prepare_metadata: general.type, then general.* from the model card."""
    writer.add_type(gguf.GGUFType.MODEL)
    total_params, shared_params, expert_params, expert_count = writer.get_total_parameter_count()
    metadata = gguf.Metadata.load(None, model_dir, model_name, total_params)
    if metadata.name is None:
        metadata.name = model_dir.name
    if metadata.size_label is None and total_params > 0:
        metadata.size_label = gguf.size_label(
            total_params, shared_params, expert_params, expert_count
        )
    metadata.set_gguf_meta_model(writer)


def _add_parameters(
    writer: gguf.GGUFWriter, model_dir: Path, hparams: dict[str, Any], block_count: int
) -> None:
    """TextModel.set_gguf_parameters as it applies to BERT, then BertModel's additions."""
    writer.add_block_count(block_count)

    def find(*keys: str) -> Any:
        return _find_hparam(hparams, list(keys), optional=True)

    n_ctx = find("max_position_embeddings", "n_ctx", "n_positions", "max_length",
                 "max_sequence_length", "model_max_length")  # fmt: skip
    if n_ctx is not None:
        writer.add_context_length(n_ctx)
    if (n_embd := find("hidden_size", "n_embd", "dim")) is not None:
        writer.add_embedding_length(n_embd)
    n_ff = find("prefix_dense_intermediate_size", "dense_intermediate_size",
                "intermediate_size", "n_inner", "hidden_dim")  # fmt: skip
    if n_ff is not None:
        writer.add_feed_forward_length(n_ff)
    if (n_head := find("num_attention_heads", "n_head", "n_heads")) is not None:
        writer.add_head_count(n_head)
    if (n_kv := find("num_key_value_heads", "n_kv_heads")) is not None:
        writer.add_head_count_kv(n_kv)
    if hparams.get("is_causal") is False:
        writer.add_causal_attention(False)
    # BERT uses learned absolute positions: no rope or expert parameters apply.
    if (rms_eps := find("rms_norm_eps", "norm_eps")) is not None:
        writer.add_layer_norm_rms_eps(rms_eps)
    if (eps := find("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")) is not None:
        writer.add_layer_norm_eps(eps)
    if (head_dim := hparams.get("head_dim")) is not None:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_file_type(_FTYPE)
    # BertModel.set_gguf_parameters
    writer.add_causal_attention(False)
    if (pooling := _pooling_type(model_dir)) is not None:
        writer.add_pooling_type(pooling)


def _pooling_type(model_dir: Path) -> gguf.PoolingType | None:
    """TextModel._try_set_pooling_type: the sentence-transformers pooling module's mode."""
    modules_path = model_dir / "modules.json"
    if not modules_path.is_file():
        return None
    with modules_path.open(encoding="utf-8") as f:
        modules = json.load(f)
    pooling_path = next((m["path"] for m in modules if m["type"].endswith("Pooling")), None)
    if pooling_path is None:
        return None
    pooling = load_json(model_dir / pooling_path / "config.json")
    modes = {
        "mean": gguf.PoolingType.MEAN,
        "cls": gguf.PoolingType.CLS,
        "lasttoken": gguf.PoolingType.LAST,
    }
    if pooling.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if pooling.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    if pooling.get("pooling_mode_lasttoken"):
        return gguf.PoolingType.LAST
    if (mode := pooling.get("pooling_mode")) in modes:
        return modes[mode]
    raise ConversionError(
        f"{pooling_path}/config.json: only MEAN, CLS and LAST pooling are supported"
    )
