"""The model catalog (issue 14): ``[models.NAME]`` tables, the GGUF files of
``models_dir``, llama-server's router preset INI, and each role's default model from
``[generation]``/``[embedding]`` (an old configuration loads unchanged)."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config import ConfigError
from daemon.config._catalog import role_of
from daemon.config._sections import Settings
from supervisor import read_gguf_info
from tests.support.config_load import load, write_toml
from tests.support.models import write_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def models(tmp_path: Path) -> Path:
    """A models directory: two generation models, an embedding model, a reranker and a
    file that is no GGUF."""
    folder = tmp_path / "models"
    folder.mkdir()
    write_model(folder / "gen-a.gguf")
    write_model(folder / "gen-b.gguf")
    write_model(folder / "emb.gguf", architecture="bert", pooling=1)
    write_model(folder / "ranker.gguf", architecture="bert", pooling=4)
    (folder / "broken.gguf").write_bytes(b"not a model at all")
    return folder


def _env(models: Path) -> dict[str, str]:
    return {"LLAMAD_MODELS_DIR": str(models),
            "LLAMAD_GENERATION_MODEL": str(models / "gen-a.gguf"),
            "LLAMAD_EMBEDDING_MODEL": str(models / "emb.gguf")}


def test_role_comes_from_the_metadata(models: Path) -> None:
    assert role_of(read_gguf_info(models / "gen-a.gguf")) == "generation"
    assert role_of(read_gguf_info(models / "emb.gguf")) == "embedding"
    assert role_of(read_gguf_info(models / "ranker.gguf")) == "rerank"


def test_models_dir_files_become_models_named_after_their_stem(models: Path) -> None:
    cat = load(models=False, env=_env(models)).catalog
    by_name = {e.name: e for e in cat.entries}
    assert set(by_name) == {"gen-a", "gen-b", "emb"}
    assert cat.defaults == {"generation": "gen-a", "embedding": "emb"}
    assert by_name["gen-a"].origin == "generation"
    assert by_name["gen-a"].aliases == ("generation",)
    assert by_name["gen-b"].origin == "models_dir"
    assert by_name["gen-b"].role == "generation"
    # A models_dir model runs with its role section's settings.
    assert by_name["gen-b"].child.ctx_size == 4096
    assert by_name["gen-b"].child.spin_count == 300
    skipped = dict(cat.skipped)
    assert "not served yet" in skipped[str(models / "ranker.gguf")]
    assert "broken.gguf" in "".join(skipped)
    assert cat.find("generation") is by_name["gen-a"]
    assert cat.find("nothing") is None


def test_models_tables_declare_models_with_their_own_settings(models: Path,
                                                             tmp_path: Path) -> None:
    toml = write_toml(tmp_path, f"""
[generation]
threads = 3

[models.small]
model = "{models / 'gen-b.gguf'}"
aliases = ["tiny", "s"]
ctx_size = 1024
pin = true
ttl = 300
preload = true
extra_args = "--n-gpu-layers 0"
env = {{ CUDA_VISIBLE_DEVICES = "1", OMP_PROC_BIND = "close" }}

[models.vectors]
model = "{models / 'emb.gguf'}"
""")
    cat = load(models=False, env=_env(models), file=toml).catalog
    small = cat.find("tiny")
    assert small is not None and small.name == "small"
    assert (small.role, small.pin, small.ttl, small.preload) == ("generation", True, 300.0,
                                                                True)
    assert small.child.ctx_size == 1024
    assert small.child.threads == 3  # from [generation]
    assert small.child.extra_argv == ("--n-gpu-layers", "0")
    assert small.child.env == (("CUDA_VISIBLE_DEVICES", "1"), ("OMP_PROC_BIND", "close"))
    vectors = cat.find("vectors")
    assert vectors is not None and vectors.role == "embedding"
    assert vectors.child.parallel == 2  # the embedding section's default
    # Declared files are not listed again under their stem.
    assert cat.find("gen-b") is None


def test_a_role_section_may_name_a_catalog_model(models: Path, tmp_path: Path) -> None:
    toml = write_toml(tmp_path, f"""
[generation]
model = "small"

[models.small]
model = "{models / 'gen-b.gguf'}"
ctx_size = 1024
""")
    env = _env(models)
    del env["LLAMAD_GENERATION_MODEL"]
    cfg = load(env=env, file=toml, models=False)
    assert cfg.catalog.defaults["generation"] == "small"
    assert cfg.generation.model == str(models / "gen-b.gguf")
    assert cfg.generation.ctx_size == 1024


@pytest.mark.parametrize(("body", "message"), [
    ('model = "{m}/gen-a.gguf"\nthreads_x = 2', "unknown setting 'threads_x'"),
    ('model = "{m}/broken.gguf"\nrole = "generation"', "is not a GGUF file"),
    ('model = "{m}/broken.gguf"', "broken.gguf"),
    ('model = "{m}/missing.gguf"', "(?i)no such file"),
    ('role = "generation"', "model must be the path of a GGUF file"),
    ('model = "{m}/gen-a.gguf"\nrole = "chat"', "role 'chat' is not one of"),
    ('model = "{m}/ranker.gguf"\nrole = "rerank"', "not served yet"),
    ('model = "{m}/ranker.gguf"', "rerank model, which is not served yet"),
    ('model = "{m}/gen-a.gguf"\nctx_size = -1', "below the minimum"),
    ('model = "{m}/gen-a.gguf"\nttl = "soon"', "models.x.ttl .*'soon'"),
    ('model = "{m}/gen-a.gguf"\naliases = ["x"]', "'x' is already used"),
    ('model = "{m}/gen-a.gguf"\naliases = ["bad name"]', "is not a model name"),
    ('model = "{m}/gen-a.gguf"\nenv = {{ "1BAD" = "x" }}', "not an environment variable"),
    ('model = "{m}/gen-a.gguf"\nenv = {{ GOOD = 1 }}', "env.GOOD must be a string"),
    ('model = "{m}/gen-a.gguf"\nenv = "CUDA_VISIBLE_DEVICES=1"', "env must be a table"),
    ('model = "{m}/gen-a.gguf"\ndevice = "cuda 0"', "device must be a device name"),
    ('model = "{m}/gen-a.gguf"\ndevice = 0', "device must be a device name"),
])
def test_bad_catalog_tables_are_clear_errors(models: Path, tmp_path: Path, body: str,
                                            message: str) -> None:
    toml = write_toml(tmp_path, "[models.x]\n" + body.format(m=models) + "\n")
    with pytest.raises(ConfigError, match=message):
        load(models=False, env=_env(models), file=toml)


def test_a_name_declared_twice_is_an_error(models: Path, tmp_path: Path) -> None:
    toml = write_toml(tmp_path, f"""
[models.a]
model = "{models / 'gen-a.gguf'}"
aliases = ["b"]

[models.b]
model = "{models / 'gen-b.gguf'}"
""")
    with pytest.raises(ConfigError, match=r"'b' is already used by models\.a"):
        load(models=False, env=_env(models), file=toml)


def test_router_preset_ini(models: Path, tmp_path: Path) -> None:
    preset = tmp_path / "models.ini"
    preset.write_text(f"""version = 1
; shared by every model
[*]
c = 2048
threads = 2   # inline comment

[qwen:Q4]
model = {models / 'gen-b.gguf'}
alias = q, q4
n-gpu-layers = 99
jinja = true
kv-offload = false
load-on-startup = true
port = 9999

[embedder]
m = {models / 'emb.gguf'}
embeddings = true
LLAMA_ARG_N_PARALLEL = 3
""")
    cat = load(models=False, env=_env(models), file=write_toml(
        tmp_path, f'models_preset = "{preset}"\n')).catalog
    qwen = cat.find("q4")
    assert qwen is not None and qwen.name == "qwen:Q4" and qwen.preload
    assert (qwen.role, qwen.child.ctx_size, qwen.child.threads) == ("generation", 2048, 2)
    assert qwen.child.extra_argv == ("--n-gpu-layers", "99", "--jinja", "--no-kv-offload")
    embedder = cat.find("embedder")
    assert embedder is not None and embedder.role == "embedding"
    assert embedder.child.parallel == 3
    assert cat.find("gen-b") is None  # the preset declared that file


def test_preset_section_sets_a_models_dir_model(models: Path, tmp_path: Path) -> None:
    preset = tmp_path / "models.ini"
    preset.write_text("[gen-b]\nctx-size = 512\n")
    cat = load(models=False, env=_env(models), file=write_toml(
        tmp_path, f'models_preset = "{preset}"\n')).catalog
    genb = cat.find("gen-b")
    assert genb is not None and genb.child.ctx_size == 512
    assert genb.origin == "models_dir"


@pytest.mark.parametrize(("text", "message"), [
    ("c = 2048\n", "outside a section"),
    ("[x]\nhf-repo = org/model\n", "downloads a model"),
    ("[x]\nthis is not ini\n", "expected \\[section\\] or key = value"),
    ("[nobody]\nc = 512\n", "no model of models_dir is called 'nobody'"),
    ("[x]\nm = /nonexistent/x.gguf\n", "(?i)no such file"),
])
def test_bad_presets_are_clear_errors(models: Path, tmp_path: Path, text: str,
                                      message: str) -> None:
    preset = tmp_path / "models.ini"
    preset.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load(models=False, env=_env(models),
             file=write_toml(tmp_path, f'models_preset = "{preset}"\n'))


def test_the_reference_config_still_loads_unchanged() -> None:
    """packaging/llamad.toml.example, with both models set as an old deployment has them:
    the roles run what they ran, and each is its role's default model."""
    cfg = load(file=REPO / "packaging" / "llamad.toml.example",
               env={"LLAMAD_MODELS_DIR": "/nonexistent/llamad-models"})
    assert cfg.generation.model == "/m/gen.gguf"
    assert cfg.embedding.model == "/m/emb.gguf"
    assert cfg.catalog.defaults == {"generation": "gen", "embedding": "emb"}
    gen = cfg.catalog.find("generation")
    assert gen is not None and gen.child is cfg.generation


def test_a_disabled_role_has_no_default(models: Path) -> None:
    env = {**_env(models), "LLAMAD_EMBEDDING_MODE": "disabled"}
    cat = load(env=env, models=False).catalog
    assert "embedding" not in cat.defaults
    assert cat.find("emb") is not None  # still a model of models_dir


def test_models_section_holds_the_pool_settings_beside_the_tables(models: Path,
                                                                  tmp_path: Path) -> None:
    toml = write_toml(tmp_path, f"""
[models]
max_resident = 2
memory_budget_mb = 4096

[models.small]
model = "{models / 'gen-b.gguf'}"
""")
    cfg = load(models=False, env=_env(models), file=toml)
    assert cfg.settings.models.max_resident == 2
    assert cfg.settings.models.memory_budget_mb == 4096
    assert cfg.catalog.find("small") is not None
    with pytest.raises(ConfigError, match=r"unknown setting 'models\.max_models'"):
        load(models=False, env=_env(models),
             file=write_toml(tmp_path, "[models]\nmax_models = 2\n"))


def test_a_roles_default_is_pinned_unless_its_table_says_otherwise(
        models: Path, tmp_path: Path) -> None:
    """A role's default stays resident (pinned) by default; ``pin = false`` in its table
    lets the pool evict it; the embedding default cannot be unpinned."""
    cat = load(models=False, env=_env(models)).catalog
    pins = {e.name: e.pin for e in cat.entries}
    assert pins["gen-a"] and pins["emb"] and not pins["gen-b"]

    def unpinned_default(role: str, name: str, gguf: str) -> tuple[dict[str, str], Path]:
        """The environment and file making ``[models.NAME]`` (``pin = false``) the role's
        default."""
        env = _env(models)
        del env[f"LLAMAD_{role.upper()}_MODEL"]
        return env, write_toml(tmp_path, f"""
[{role}]
model = "{name}"

[models.{name}]
model = "{models / gguf}"
pin = false
""")

    env, toml = unpinned_default("generation", "small", "gen-b.gguf")
    cat = load(env=env, file=toml, models=False).catalog
    assert cat.defaults["generation"] == "small"
    assert not next(e for e in cat.entries if e.name == "small").pin
    env, toml = unpinned_default("embedding", "vectors", "emb.gguf")
    with pytest.raises(ConfigError, match="pin = false on the embedding role's default"):
        load(env=env, file=toml, models=False)


def test_a_model_placed_on_a_device(models: Path, tmp_path: Path) -> None:
    """``device`` places a model's memory on a device with its own budget
    (``[models] device_budgets_mb``); a budget list that does not parse stops the load."""
    toml = write_toml(tmp_path, f"""
[models]
device_budgets_mb = "cuda0=7500"

[models.big]
model = "{models / 'gen-b.gguf'}"
device = "cuda0"
extra_args = "-ngl 99"
""")
    cat = load(models=False, env=_env(models), file=toml).catalog
    big = next(e for e in cat.entries if e.name == "big")
    assert big.device == "cuda0" and big.child.extra_argv == ("-ngl", "99")
    assert next(e for e in cat.entries if e.name == "gen-a").device == ""
    bad = write_toml(tmp_path, '[models]\ndevice_budgets_mb = "cuda0:7500"\n')
    with pytest.raises(ConfigError, match=r"models\.device_budgets_mb: 'cuda0:7500'"):
        load(models=False, env=_env(models), file=bad)


def test_one_resident_model_keeps_openmps_own_spin(models: Path, tmp_path: Path) -> None:
    """With room for one model, no child shares the cores: the children (the roles' and
    the catalog's) keep OpenMP's default spin, unless spin_count is set explicitly."""
    toml = write_toml(tmp_path, f"""
[models]
max_resident = 1

[models.other]
model = "{models / 'gen-b.gguf'}"
""")
    cfg = load(models=False, env=_env(models), file=toml)
    assert cfg.generation.spin_count == -1
    assert {e.name: e.child.spin_count for e in cfg.catalog.entries}["other"] == -1
    env = _env(models) | {"LLAMAD_GENERATION_SPIN_COUNT": "300"}
    assert load(models=False, env=env, file=toml).generation.spin_count == 300
    assert load(models=False, env=_env(models)).generation.spin_count == 300


def test_generation_models_resident_together_share_the_cores(models: Path,
                                                             tmp_path: Path) -> None:
    """Two generation models that stay resident together (the pinned default and a
    preloaded one) each get half the cores, as does one loaded on demand beside them; a
    model's own threads, and generation.threads set anywhere, win; one resident
    generation model (the embedding model does not count) keeps every core. The embedding
    model, which has a background instance, gets half the cores (the instance the other
    half)."""
    cores = Settings().generation.threads
    half = max(1, cores // 2)
    toml = write_toml(tmp_path, f"""
[models.other]
model = "{models / 'gen-b.gguf'}"
preload = true

[models.mine]
model = "{write_model(tmp_path / 'gen-c.gguf')}"
threads = 7
""")
    cfg = load(models=False, env=_env(models), file=toml)
    threads = {e.name: e.child.threads for e in cfg.catalog.entries}
    assert threads == {"gen-a": half, "other": half, "mine": 7, "emb": half}
    assert cfg.generation.threads == half  # the role's default model runs with it
    env = _env(models) | {"LLAMAD_GENERATION_THREADS": str(cores)}
    explicit = load(models=False, env=env, file=toml)
    assert {e.name: e.child.threads for e in explicit.catalog.entries}["other"] == cores
    # Room for one at a time: nothing shares the cores.
    one = tmp_path / "one.toml"
    one.write_text(f"[models]\nmax_resident = 1\n\n{toml.read_text()}")
    assert load(models=False, env=_env(models), file=one).generation.threads == cores
    # Only the default stays resident: the models_dir model loads on demand, every core.
    alone = load(models=False, env=_env(models)).catalog
    assert {e.name: e.child.threads for e in alone.entries}["gen-b"] == cores
