"""The child-argument policy (supervisor/_args.py, over supervisor/_options.py's tables):
the API's allow-list, the operator files' deny-list, file options confined to the models
directory, and the child variables that would set a refused option or reach the host; then
the configuration refusing each at load, naming the argument.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from daemon.config import ConfigError
from supervisor import ArgumentRefused, check_api_args, check_child_env, check_operator_args
from supervisor._options import (
    API,
    API_ALLOWED,
    BUNDLED_LITERAL,
    BUNDLED_OPTIONS,
    FILE,
    LLAMA_SERVER_OPTIONS,
    MANY,
    REFUSED,
    ChildOption,
)
from tests.support.config_load import load, write_toml
from tests.support.models import write_model

MODELS = Path("/srv/models")

# What the hostile tester reached for, and what llamad passes itself: each must be in
# the tables as refused, in every spelling.
MUST_REFUSE = ("--host", "--port", "--api-key", "--api-key-file", "-m", "--model", "-a",
               "--alias", "--log-file", "--path", "--slot-save-path", "--rpc", "--webui",
               "--ui", "--no-webui", "--tools", "--agent", "--mcp-servers-config",
               "--ssl-key-file", "--ssl-cert-file", "--media-path", "--log-prompts-dir",
               "-hf", "--model-url", "--threads", "-c", "--ctx-size", "-np", "--parallel",
               "--embedding", "--slots", "--models-preset", "--ssl_keyfile", "--config_file",
               "--model_alias", "--root_path", "--rpc_servers", "--video-ffmpeg-dir")


def _all_options() -> list[ChildOption]:
    return [*LLAMA_SERVER_OPTIONS, *BUNDLED_OPTIONS]


def _with_value(opt: ChildOption, spelling: str, value: str = "1") -> list[str]:
    return [spelling] + [value] * (1 if opt.arity == MANY else opt.arity)


def _underscored(spelling: str) -> str:
    return "--" + spelling[2:].replace("-", "_") if spelling.startswith("--") else spelling


def test_the_tables_hold_every_option_the_tester_used() -> None:
    """The known host-reaching and owned options are refused from every source."""
    for name in MUST_REFUSE:
        normal = name.replace("_", "-") if name.startswith("--") else name
        assert normal in REFUSED, name
        assert normal not in API_ALLOWED, name


@pytest.mark.parametrize("opt", [o for o in _all_options() if o.name in {
    n for n in REFUSED}], ids=lambda o: o.name)
def test_refused_options_are_refused_in_every_spelling(opt: ChildOption) -> None:
    """Every spelling of an owned, host-reaching, downloading or exiting option, as
    ``--opt value``, ``--opt=value`` and ``--opt_with_underscores``, is refused by both
    checks, naming the option."""
    for spelling in opt.names:
        forms = [_with_value(opt, spelling)]
        if opt.arity:
            forms.append([f"{spelling}=1"])
        if spelling.startswith("--") and "-" in spelling[2:]:
            forms.append(_with_value(opt, _underscored(spelling)))
        for args in forms:
            with pytest.raises(ArgumentRefused) as err:
                check_api_args(args)
            assert args[0].split("=")[0] in str(err.value)
            with pytest.raises(ArgumentRefused, match="is refused"):
                check_operator_args(args, MODELS)


@pytest.mark.parametrize("opt", [o for o in _all_options() if o.kind == API],
                         ids=lambda o: o.name)
def test_allowed_options_pass_in_every_spelling(opt: ChildOption) -> None:
    """Every spelling of an allowed option passes the API and the operator check."""
    for spelling in opt.names:
        args = _with_value(opt, spelling)
        assert check_api_args(args) == tuple(args)
        assert check_operator_args(args, MODELS) == tuple(args)


def test_the_api_takes_knobs_and_refuses_the_rest_by_name() -> None:
    """A realistic Swap passes; files, hosts and operator options are refused, the
    argument named with why."""
    good = ["-ngl", "99", "--flash-attn", "on", "-ctk", "q8_0", "--cache-type-v", "q8_0",
            "--rope-freq-base", "10000", "--yarn-orig-ctx", "4096", "--numa", "distribute",
            "-cb", "--defrag-thold", "-1", "--tensor-split", "3,1", "--main-gpu", "0",
            "--split-mode", "layer", "--override-kv", "tokenizer.ggml.add_bos_token=bool:false",
            "--load-mode", "mlock", "--n_gpu_layers=5"]
    assert check_api_args(good) == tuple(good)
    for args, named, why in [
        (["--host", "0.0.0.0"], "--host", "listens only where llamad puts it"),
        (["--log-file", "/tmp/x"], "--log-file", "writes a file on the host"),
        (["--chat-template-file", "/etc/passwd"], "--chat-template-file",
         "performance and model-behaviour options only"),
        (["--log_file=/tmp/x"], "--log_file", "writes a file"),
        (["-ngl", "--host"], "--host", "looks like an option"),
        (["--hos", "0.0.0.0"], "--hos", "not an option"),
        (["0.0.0.0"], "0.0.0.0", "is not an option"),
        (["--seed"], "--seed", "needs a value"),
        (["--jinja=0"], "--jinja", "takes no value"),
        (["--lora", "/srv/models/a.gguf"], "--lora", "operator's configuration"),
    ]:
        with pytest.raises(ArgumentRefused) as err:
            check_api_args(args)
        assert named in str(err.value) and why in str(err.value), str(err.value)
        assert err.value.argument.startswith(named)


def test_argparse_abbreviations_are_judged_as_the_option_they_begin() -> None:
    """llama_cpp.server's argparse takes ``--rpc`` for ``--rpc_servers``: an unknown
    prefix is refused, and no allowed spelling is a prefix of a stricter bundled one."""
    for name in API_ALLOWED:
        if name.startswith("--") and name not in BUNDLED_LITERAL:
            assert not [b for b in BUNDLED_LITERAL if b.startswith(name)], name
    with pytest.raises(ArgumentRefused):
        check_api_args(["--ssl_key", "x"])


def test_operator_file_options_read_only_inside_the_models_dir(tmp_path: Path) -> None:
    """A file option takes an absolute path inside models_dir (symbolic links resolved);
    outside, relative, or a link out of it is refused, naming the option and the path."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "t.jinja").write_text("{{ messages }}")
    os.symlink("/etc/passwd", models / "escape.jinja")
    inside = ["--chat-template-file", str(models / "t.jinja"), "--lora",
              f"{models}/a.gguf,{models}/b.gguf", "--lora-scaled", f"{models}/a.gguf:0.5",
              "--grammar-file", str(models / "g.gbnf"), "--mmproj", str(models / "mm.gguf"),
              "--metrics", "--timeout", "900", "--chat-template", "chatml"]
    assert check_operator_args(inside, models) == tuple(inside)
    for args, needle in [
        (["--chat-template-file", "/etc/passwd"], "outside the models directory"),
        (["--chat-template-file", str(models / "escape.jinja")], "outside the models"),
        (["--chat-template-file", "t.jinja"], "give an absolute path"),
        (["--chat-template-file", f"{models}/../secret"], "outside the models"),
        (["--lora", f"{models}/a.gguf,/etc/shadow"], "'/etc/shadow' is outside"),
        (["--control-vector-scaled", "/etc/x:1.0"], "outside"),
        (["--json-schema-file=/etc/passwd"], "outside"),
        (["--lookup-cache-dynamic", str(models / "c.bin")], "is refused"),
    ]:
        with pytest.raises(ArgumentRefused, match=needle) as err:
            check_operator_args(args, models)
        assert args[0].split("=")[0] in str(err.value)
    # Every file option of both runtimes is confined (none passes from outside).
    for opt in _all_options():
        if opt.kind == FILE:
            with pytest.raises(ArgumentRefused):
                check_operator_args([opt.names[0], "/etc/passwd"], models)


@pytest.mark.parametrize(("name", "value"), [
    ("LLAMA_ARG_HOST", "0.0.0.0"), ("LLAMA_ARG_PORT", "80"), ("LLAMA_API_KEY", "k"),
    ("LLAMA_ARG_API_KEY_FILE", "/k"), ("LLAMA_ARG_LOG_FILE", "/tmp/x"),
    ("LLAMA_ARG_STATIC_PATH", "/"), ("LLAMA_ARG_UI", "1"), ("LLAMA_ARG_NO_UI", "1"),
    ("LLAMA_ARG_TOOLS", "all"), ("LLAMA_ARG_SSL_KEY_FILE", "/k"), ("LLAMA_ARG_RPC", "h:1"),
    ("LLAMA_ARG_CHAT_TEMPLATE_FILE", "/etc/passwd"), ("LLAMA_ARG_MODEL", "/m.gguf"),
    ("LLAMA_ARG_SOMETHING_NEW", "1"), ("LLAMA_SERVER_SLOTS_DEBUG", "1"),
    ("AIP_MODE", "PREDICTION"), ("HF_TOKEN", "t"), ("HOST", "0.0.0.0"), ("PORT", "80"),
    ("api_key", "k"), ("SSL_KEYFILE", "/k"), ("CONFIG_FILE", "/x.json"), ("LD_PRELOAD", "/x.so"),
    ("PYTHONPATH", "/tmp"), ("HOME", "/tmp"), ("XDG_CONFIG_HOME", "/tmp"),
])
def test_child_variables_that_set_refused_options_are_refused(name: str, value: str) -> None:
    """A catalog model's env may not do through a variable what extra_args may not."""
    with pytest.raises(ArgumentRefused, match=name):
        check_child_env({name: value}, MODELS)


def test_ordinary_child_variables_pass() -> None:
    """Device selection, OpenMP and allowed LLAMA_ARG_* knobs pass."""
    check_child_env((("CUDA_VISIBLE_DEVICES", "1"), ("GOMP_SPINCOUNT", "300"),
                     ("LLAMA_ARG_N_GPU_LAYERS", "99"), ("LLAMA_ARG_FLASH_ATTN", "on"),
                     ("LLAMA_ARG_NO_CONT_BATCHING", "1"),
                     ("LLAMA_ARG_CHAT_TEMPLATE_FILE", f"{MODELS}/t.jinja")), MODELS)


# --- at configuration load --------------------------------------------------------------


def test_role_extra_args_are_refused_at_load_naming_the_argument() -> None:
    """[generation] extra_args with a host-reaching option fails the whole load."""
    with pytest.raises(ConfigError, match=r"generation\.extra_args: --log-file is refused"):
        load("--generation-extra-args=-ngl 0 --log-file /tmp/llamad-x")
    with pytest.raises(ConfigError, match=r"embedding\.extra_args: --host is refused"):
        load(env={"LLAMAD_EMBEDDING_EXTRA_ARGS": "--host 0.0.0.0"})
    assert load("--generation-extra-args=-ngl 0 --flash-attn on").generation.extra_argv == (
        "-ngl", "0", "--flash-attn", "on")


def test_catalog_tables_and_env_are_refused_at_load(tmp_path: Path) -> None:
    """A [models.NAME] table's extra_args or env, and a preset's argument, are checked
    as the role sections' are."""
    models = tmp_path / "models"
    models.mkdir()
    write_model(models / "gen.gguf")
    write_model(models / "other.gguf")
    env = {"LLAMAD_MODELS_DIR": str(models), "LLAMAD_GENERATION_MODEL": str(models / "gen.gguf"),
           "LLAMAD_EMBEDDING_MODE": "disabled"}
    table = f'[models.g]\nmodel = "{models / "other.gguf"}"\n'
    for extra, needle in [
        ('extra_args = "--chat-template-file /etc/passwd"', "outside the models directory"),
        ('extra_args = "--webui"', "--webui is refused"),
        ('env = { LLAMA_ARG_HOST = "0.0.0.0" }', r"models\.g\.env: LLAMA_ARG_HOST sets --host"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            load(models=False, env=env, file=write_toml(tmp_path, table + extra + "\n"))
    preset = tmp_path / "preset.ini"
    preset.write_text(f"[p]\nmodel = {models / 'other.gguf'}\nlog-file = /tmp/llamad-x\n")
    with pytest.raises(ConfigError, match=r"models_preset \[p\]\.extra_args: --log-file"):
        load(models=False, env=env, file=write_toml(tmp_path, f'models_preset = "{preset}"\n'))
    good = load(models=False, env=env, file=write_toml(
        tmp_path, table + f'extra_args = "--chat-template-file {models}/t.jinja -ngl 0"\n'))
    assert good.catalog.find("g") is not None
