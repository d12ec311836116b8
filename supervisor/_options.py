"""The options llama.cpp's runtimes register, each with its kind, arity, spellings and
variable: the tables the child-argument policy (:mod:`supervisor._args`) judges by.

The tables are read off the options of llama.cpp's ``common/arg.cpp`` vendored in
llama-cpp-python 0.3.36 (the llama-server llamad builds and tests), the options llama-server
registers, each with every spelling (llama.cpp reads ``--a_b`` as ``--a-b``), whether it
takes a value and its ``LLAMA_ARG_*`` variable; and off llama_cpp.server's settings (its
argparse options, spelled with underscores). A spelling both runtimes know gets the stricter
kind of the two.
"""

from __future__ import annotations

from dataclasses import dataclass

# Kinds of option, from the most permissive to the strictest.
API = "api"            # a performance or model-behaviour knob: allowed from the API too
OPERATOR = "operator"  # allowed from an operator's files only
FILE = "file"          # operator only; its value names files inside the models directory
OWNED = "owned"        # llamad sets it
HOST = "host"          # reaches the host: listens, writes or serves files, runs tools
DOWNLOAD = "download"  # fetches a model or a file from the network
EXITS = "exits"        # prints something and exits: never a server
STRICTNESS = (API, OPERATOR, FILE, OWNED, HOST, DOWNLOAD, EXITS)

MANY = -1
"""Arity of an option taking every following value (llama_cpp.server's list options)."""

# llama-server's options: kind, values taken (0, 1 or 2), every spelling, its variable (an
# indented line continues the one before).
# Read off common/arg.cpp (llama-cpp-python 0.3.36), options registered for the server.
_LLAMA_SERVER = """
exits 0 -h --help --usage
exits 0 --version
exits 0 -cl --cache-list
exits 0 --completion-bash
exits 0 --list-devices
owned 1 -t --threads LLAMA_ARG_THREADS
owned 1 -tb --threads-batch
api 1 -C --cpu-mask
api 1 -Cr --cpu-range
api 1 --cpu-strict
operator 1 --prio
api 1 --poll
api 1 -Cb --cpu-mask-batch
api 1 -Crb --cpu-range-batch
api 1 --cpu-strict-batch
operator 1 --prio-batch
api 1 --poll-batch
file 1 -lcs --lookup-cache-static
host 1 -lcd --lookup-cache-dynamic
owned 1 -c --ctx-size LLAMA_ARG_CTX_SIZE
api 1 --kv-unified-per-slot LLAMA_ARG_KV_UNIFIED_PER_SLOT
api 1 -n --predict --n-predict LLAMA_ARG_N_PREDICT
owned 1 -b --batch-size LLAMA_ARG_BATCH
owned 1 -ub --ubatch-size LLAMA_ARG_UBATCH
api 1 --keep
api 0 --swa-full LLAMA_ARG_SWA_FULL
api 1 -ctxcp --ctx-checkpoints --swa-checkpoints LLAMA_ARG_CTX_CHECKPOINTS
api 1 -cms --checkpoint-min-step LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT
owned 1 -cram --cache-ram LLAMA_ARG_CACHE_RAM
api 0 -kvu --kv-unified -no-kvu --no-kv-unified LLAMA_ARG_KV_UNIFIED
api 0 --cache-idle-slots --no-cache-idle-slots LLAMA_ARG_CACHE_IDLE_SLOTS
api 0 --context-shift --no-context-shift LLAMA_ARG_CONTEXT_SHIFT
api 1 -fa --flash-attn LLAMA_ARG_FLASH_ATTN
api 0 --perf --no-perf LLAMA_ARG_PERF
operator 0 -e --escape --no-escape
api 1 -r --reverse-prompt
api 0 -sp --special
api 0 --warmup --no-warmup
api 0 --spm-infill
api 1 --samplers
api 1 -s --seed
api 1 --sampler-seq --sampling-seq
api 0 --ignore-eos
api 1 --temp --temperature LLAMA_ARG_TEMPERATURE
api 1 --top-k LLAMA_ARG_TOP_K
api 1 --top-p LLAMA_ARG_TOP_P
api 1 --min-p LLAMA_ARG_MIN_P
api 1 --top-nsigma --top-n-sigma
api 1 --xtc-probability
api 1 --xtc-threshold
api 1 --typical --typical-p
api 1 --repeat-last-n
api 1 --repeat-penalty LLAMA_ARG_REPEAT_PENALTY
api 1 --presence-penalty LLAMA_ARG_PRESENCE_PENALTY
api 1 --frequency-penalty LLAMA_ARG_FREQUENCY_PENALTY
api 1 --dry-multiplier
api 1 --dry-base
api 1 --dry-allowed-length
api 1 --dry-penalty-last-n
api 1 --dry-sequence-breaker
api 1 --adaptive-target
api 1 --adaptive-decay
api 1 --dynatemp-range
api 1 --dynatemp-exp
api 1 --mirostat
api 1 --mirostat-lr
api 1 --mirostat-ent
api 1 -l --logit-bias
api 1 --grammar
file 1 --grammar-file
api 1 -j --json-schema
file 1 -jf --json-schema-file
api 0 -bs --backend-sampling LLAMA_ARG_BACKEND_SAMPLING
operator 1 --pooling LLAMA_ARG_POOLING
api 1 --rope-scaling LLAMA_ARG_ROPE_SCALING_TYPE
api 1 --rope-scale LLAMA_ARG_ROPE_SCALE
api 1 --rope-freq-base LLAMA_ARG_ROPE_FREQ_BASE
api 1 --rope-freq-scale LLAMA_ARG_ROPE_FREQ_SCALE
api 1 --yarn-orig-ctx LLAMA_ARG_YARN_ORIG_CTX
api 1 --yarn-ext-factor LLAMA_ARG_YARN_EXT_FACTOR
api 1 --yarn-attn-factor LLAMA_ARG_YARN_ATTN_FACTOR
api 1 --yarn-beta-slow LLAMA_ARG_YARN_BETA_SLOW
api 1 --yarn-beta-fast LLAMA_ARG_YARN_BETA_FAST
api 0 -kvo --kv-offload -nkvo --no-kv-offload LLAMA_ARG_KV_OFFLOAD
api 0 --repack -nr --no-repack LLAMA_ARG_REPACK
api 0 --no-host LLAMA_ARG_NO_HOST
api 1 -ctk --cache-type-k LLAMA_ARG_CACHE_TYPE_K
api 1 -ctv --cache-type-v LLAMA_ARG_CACHE_TYPE_V
api 1 -dt --defrag-thold LLAMA_ARG_DEFRAG_THOLD
owned 1 -np --parallel LLAMA_ARG_N_PARALLEL
api 0 -cb --cont-batching -nocb --no-cont-batching LLAMA_ARG_CONT_BATCHING
file 1 -mm --mmproj LLAMA_ARG_MMPROJ
download 1 -mmu --mmproj-url LLAMA_ARG_MMPROJ_URL
operator 0 --mmproj-auto --no-mmproj --no-mmproj-auto LLAMA_ARG_MMPROJ_AUTO
operator 0 --mmproj-offload --no-mmproj-offload LLAMA_ARG_MMPROJ_OFFLOAD
operator 1 -mmdev --mmproj-device MTMD_BACKEND_DEVICE
operator 1 --image-min-tokens LLAMA_ARG_IMAGE_MIN_TOKENS
operator 1 --image-max-tokens LLAMA_ARG_IMAGE_MAX_TOKENS
operator 1 --mtmd-batch-max-tokens LLAMA_ARG_MTMD_BATCH_MAX_TOKENS
operator 1 --video-fps LLAMA_ARG_VIDEO_FPS
operator 1 --video-timestamp-interval LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL
host 1 --video-ffmpeg-dir LLAMA_ARG_VIDEO_FFMPEG_DIR
host 1 --rpc LLAMA_ARG_RPC
api 1 -lm --load-mode LLAMA_ARG_LOAD_MODE
api 1 -lzm --lazy-mode LLAMA_ARG_LAZY_MODE
api 1 --numa LLAMA_ARG_NUMA
api 1 -dev --device LLAMA_ARG_DEVICE
api 1 -ot --override-tensor LLAMA_ARG_OVERRIDE_TENSOR
api 0 -cmoe --cpu-moe LLAMA_ARG_CPU_MOE
api 1 -ncmoe --n-cpu-moe LLAMA_ARG_N_CPU_MOE
api 1 -ncffn --n-cpu-ffn LLAMA_ARG_N_CPU_FFN
api 1 -ngl --gpu-layers --n-gpu-layers LLAMA_ARG_N_GPU_LAYERS
api 1 -sm --split-mode LLAMA_ARG_SPLIT_MODE
api 1 -ts --tensor-split LLAMA_ARG_TENSOR_SPLIT
api 1 -mg --main-gpu LLAMA_ARG_MAIN_GPU
api 1 -fit --fit LLAMA_ARG_FIT
api 1 -fitt --fit-target LLAMA_ARG_FIT_TARGET
api 1 -fitc --fit-ctx LLAMA_ARG_FIT_CTX
api 0 --check-tensors
api 1 --override-kv
api 0 --op-offload --no-op-offload
file 1 --lora
file 1 --lora-scaled
file 1 --control-vector
file 1 --control-vector-scaled
operator 2 --control-vector-layer-range
owned 1 -a --alias LLAMA_ARG_ALIAS
operator 1 --tags LLAMA_ARG_TAGS
owned 1 -m --model LLAMA_ARG_MODEL
download 1 -mu --model-url LLAMA_ARG_MODEL_URL
download 1 -dr --docker-repo LLAMA_ARG_DOCKER_REPO
download 1 -hf -hfr --hf-repo LLAMA_ARG_HF_REPO
download 1 -hff --hf-file LLAMA_ARG_HF_FILE
download 1 -hft --hf-token HF_TOKEN
operator 1 --embd-normalize
owned 1 --host LLAMA_ARG_HOST
owned 1 --port LLAMA_ARG_PORT
owned 0 --reuse-port LLAMA_ARG_REUSE_PORT
host 1 --path LLAMA_ARG_STATIC_PATH
host 1 --cors-origins LLAMA_ARG_CORS_ORIGINS
host 1 --cors-methods LLAMA_ARG_CORS_METHODS
host 1 --cors-headers LLAMA_ARG_CORS_HEADERS
host 0 --cors-credentials --no-cors-credentials LLAMA_ARG_CORS_CREDENTIALS
owned 1 --api-prefix LLAMA_ARG_API_PREFIX
host 1 --ui-config --webui-config LLAMA_ARG_UI_CONFIG
host 1 --ui-config-file --webui-config-file LLAMA_ARG_UI_CONFIG_FILE
host 0 --ui-mcp-proxy --webui-mcp-proxy --no-ui-mcp-proxy --no-webui-mcp-proxy
    LLAMA_ARG_UI_MCP_PROXY
host 1 --tools LLAMA_ARG_TOOLS
host 1 --tools-runtime LLAMA_ARG_TOOLS_RUNTIME
host 1 --mcp-servers-config LLAMA_ARG_MCP_SERVERS_CONFIG
host 1 --mcp-servers-json LLAMA_ARG_MCP_SERVERS_JSON
host 0 -ag --agent -no-ag --no-agent LLAMA_ARG_AGENT
host 0 --ui --webui --no-ui --no-webui LLAMA_ARG_UI
owned 0 --embedding --embeddings LLAMA_ARG_EMBEDDINGS
owned 0 --rerank --reranking LLAMA_ARG_RERANKING
owned 1 --api-key LLAMA_API_KEY
owned 1 --api-key-file LLAMA_ARG_API_KEY_FILE
host 1 --ssl-key-file LLAMA_ARG_SSL_KEY_FILE
host 1 --ssl-cert-file LLAMA_ARG_SSL_CERT_FILE
api 1 --chat-template-kwargs LLAMA_ARG_CHAT_TEMPLATE_KWARGS
operator 1 -to --timeout LLAMA_ARG_TIMEOUT
operator 1 --sse-ping-interval LLAMA_ARG_SSE_PING_INTERVAL
api 1 --threads-http LLAMA_ARG_THREADS_HTTP
api 0 --cache-prompt --no-cache-prompt LLAMA_ARG_CACHE_PROMPT
api 1 --cache-reuse LLAMA_ARG_CACHE_REUSE
operator 0 --metrics LLAMA_ARG_ENDPOINT_METRICS
operator 0 --props LLAMA_ARG_ENDPOINT_PROPS
owned 0 --slots --no-slots LLAMA_ARG_ENDPOINT_SLOTS
host 1 --slot-save-path
host 1 --media-path
owned 1 --models-dir LLAMA_ARG_MODELS_DIR
owned 1 --models-preset LLAMA_ARG_MODELS_PRESET
owned 1 --models-max LLAMA_ARG_MODELS_MAX
owned 0 --models-autoload --no-models-autoload LLAMA_ARG_MODELS_AUTOLOAD
api 0 --jinja --no-jinja LLAMA_ARG_JINJA
api 1 --reasoning-format LLAMA_ARG_THINK
api 1 -rea --reasoning LLAMA_ARG_REASONING
api 1 --reasoning-effort LLAMA_ARG_REASONING_EFFORT
api 1 --reasoning-budget LLAMA_ARG_THINK_BUDGET
api 1 --reasoning-budget-message LLAMA_ARG_THINK_BUDGET_MESSAGE
api 0 --reasoning-preserve --no-reasoning-preserve LLAMA_ARG_REASONING_PRESERVE
operator 1 --chat-template LLAMA_ARG_CHAT_TEMPLATE
file 1 --chat-template-file LLAMA_ARG_CHAT_TEMPLATE_FILE
api 0 --skip-chat-parsing --no-skip-chat-parsing LLAMA_ARG_SKIP_CHAT_PARSING
api 0 --prefill-assistant --no-prefill-assistant LLAMA_ARG_PREFILL_ASSISTANT
api 1 -sps --slot-prompt-similarity
operator 0 --lora-init-without-apply
operator 1 --sleep-idle-seconds
operator 0 --log-disable
host 1 --log-file LLAMA_ARG_LOG_FILE
operator 0 --log-jsonl --no-log-jsonl LLAMA_ARG_LOG_JSONL
host 1 --log-prompts-dir
operator 1 --log-colors LLAMA_ARG_LOG_COLORS
operator 0 -v --verbose --log-verbose
api 0 --offline LLAMA_ARG_OFFLINE
operator 1 -lv --verbosity --log-verbosity LLAMA_ARG_LOG_VERBOSITY
operator 0 --log-prefix --no-log-prefix LLAMA_ARG_LOG_PREFIX
operator 0 --log-timestamps --no-log-timestamps LLAMA_ARG_LOG_TIMESTAMPS
download 1 --spec-draft-hf -hfd -hfrd --hf-repo-draft LLAMA_ARG_SPEC_DRAFT_HF_REPO
operator 1 --spec-draft-threads -td --threads-draft
operator 1 --spec-draft-threads-batch -tbd --threads-batch-draft
operator 1 --spec-draft-cpu-mask -Cd --cpu-mask-draft
operator 1 --spec-draft-cpu-range -Crd --cpu-range-draft
operator 1 --spec-draft-cpu-strict --cpu-strict-draft
operator 1 --spec-draft-prio --prio-draft
operator 1 --spec-draft-poll --poll-draft
operator 1 --spec-draft-cpu-mask-batch -Cbd --cpu-mask-batch-draft
operator 1 --spec-draft-cpu-strict-batch --cpu-strict-batch-draft
operator 1 --spec-draft-prio-batch --prio-batch-draft
operator 1 --spec-draft-poll-batch --poll-batch-draft
operator 1 --spec-draft-type-k -ctkd --cache-type-k-draft LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K
operator 1 --spec-draft-type-v -ctvd --cache-type-v-draft LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V
operator 1 --spec-draft-override-tensor -otd --override-tensor-draft
operator 0 --spec-draft-cpu-moe -cmoed --cpu-moe-draft LLAMA_ARG_SPEC_DRAFT_CPU_MOE
operator 1 --spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed --n-cpu-moe-draft
    LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE
operator 1 --spec-draft-n-max LLAMA_ARG_SPEC_DRAFT_N_MAX
operator 1 --spec-draft-n-min LLAMA_ARG_SPEC_DRAFT_N_MIN
operator 1 --spec-synth-len LLAMA_ARG_SPEC_SYNTH_LEN
operator 1 --spec-synth-rates LLAMA_ARG_SPEC_SYNTH_RATES
operator 1 --spec-draft-p-split --draft-p-split LLAMA_ARG_SPEC_DRAFT_P_SPLIT
operator 1 --spec-draft-p-min --draft-p-min LLAMA_ARG_SPEC_DRAFT_P_MIN
operator 0 --spec-draft-backend-sampling --no-spec-draft-backend-sampling
    LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING
operator 1 --spec-draft-device -devd --device-draft
operator 1 --spec-draft-ngl -ngld --gpu-layers-draft --n-gpu-layers-draft
    LLAMA_ARG_N_GPU_LAYERS_DRAFT
file 1 --spec-draft-model -md --model-draft LLAMA_ARG_SPEC_DRAFT_MODEL
api 1 --spec-type LLAMA_ARG_SPEC_TYPE
api 1 --spec-ngram-mod-n-min
api 1 --spec-ngram-mod-n-max
api 1 --spec-ngram-mod-n-match
api 1 --spec-ngram-simple-size-n
api 1 --spec-ngram-simple-size-m
api 1 --spec-ngram-simple-min-hits
api 1 --spec-ngram-map-k-size-n
api 1 --spec-ngram-map-k-size-m
api 1 --spec-ngram-map-k-min-hits
api 1 --spec-ngram-map-k4v-size-n
api 1 --spec-ngram-map-k4v-size-m
api 1 --spec-ngram-map-k4v-min-hits
exits 1 --draft --draft-n --draft-max LLAMA_ARG_DRAFT_MAX
exits 1 --draft-min --draft-n-min LLAMA_ARG_DRAFT_MIN
exits 1 --spec-ngram-size-n
exits 1 --spec-ngram-size-m
exits 1 --spec-ngram-min-hits
download 0 --embd-gemma-default
download 0 --fim-qwen-1.5b-default
download 0 --fim-qwen-3b-default
download 0 --fim-qwen-7b-default
download 0 --fim-qwen-7b-spec
download 0 --fim-qwen-14b-spec
download 0 --fim-qwen-30b-default
download 0 --gpt-oss-20b-default
download 0 --gpt-oss-120b-default
download 0 --vision-gemma-4b-default
download 0 --vision-gemma-12b-default
download 0 --spec-default
"""

# llama_cpp.server's options (its settings as argparse options; a boolean takes a value,
# "true" or "false"; a list takes every value that follows).
_BUNDLED = """
exits 0 -h --help
owned 1 --model
owned 1 --model_alias
api 1 --n_gpu_layers
api 1 --split_mode
api 1 --main_gpu
api * --tensor_split
operator 1 --vocab_only
api 1 --use_mmap
api 1 --use_mlock
api * --kv_overrides
host 1 --rpc_servers
api 1 --seed
owned 1 --n_ctx
owned 1 --n_batch
owned 1 --n_ubatch
owned 1 --n_threads
owned 1 --n_threads_batch
api 1 --rope_scaling_type
api 1 --rope_freq_base
api 1 --rope_freq_scale
api 1 --yarn_ext_factor
api 1 --yarn_attn_factor
api 1 --yarn_beta_fast
api 1 --yarn_beta_slow
api 1 --yarn_orig_ctx
api 1 --mul_mat_q
operator 1 --logits_all
owned 1 --embedding
api 1 --offload_kqv
api 1 --flash_attn
operator 1 --last_n_tokens_size
file 1 --lora_base
file 1 --lora_path
api 1 --numa
owned 1 --chat_format
api 1 --chat_template_kwargs
file 1 --clip_model_path
operator 1 --cache
host 1 --cache_type
operator 1 --cache_size
file 1 --hf_tokenizer_config_path
download 1 --hf_pretrained_model_name_or_path
download 1 --hf_model_repo_id
operator 1 --draft_model
operator 1 --draft_model_num_pred_tokens
api 1 --type_k
api 1 --type_v
owned 1 --verbose
owned 1 --host
owned 1 --port
host 1 --ssl_keyfile
host 1 --ssl_certfile
owned 1 --api_key
owned 1 --interrupt_requests
operator 1 --disable_ping_events
owned 1 --root_path
host 1 --config_file
"""


@dataclass(frozen=True)
class ChildOption:
    """One option of a runtime, under all its spellings.

    Attributes:
        names: every spelling, normalised (see :func:`normalise`).
        kind: ``api``, ``operator``, ``file``, ``owned``, ``host``, ``download`` or
            ``exits`` (the strictest of the runtimes that know a spelling).
        arity: how many values follow it (:data:`MANY`: every value that follows).
        env: its ``LLAMA_ARG_*`` (or other) environment variable, if it has one.
    """

    names: tuple[str, ...]
    kind: str
    arity: int
    env: str | None = None

    @property
    def name(self) -> str:
        """Its longest spelling, for messages."""
        return max(self.names, key=len)


def normalise(name: str) -> str:
    """An option's name as llama.cpp reads it: ``--a_b`` is ``--a-b`` (only after two
    dashes; ``-a_b`` stays)."""
    return name.replace("_", "-") if name.startswith("--") else name


def _parse(table: str) -> list[ChildOption]:
    """A table's lines (an indented line continues the one before) as options."""
    options = []
    for line in table.strip().replace("\n    ", " ").splitlines():
        kind, arity, *words = line.split()
        env = words.pop() if not words[-1].startswith("-") else None
        options.append(ChildOption(tuple(normalise(w) for w in words), kind,
                                   MANY if arity == "*" else int(arity), env))
    return options


def _merge(*tables: list[ChildOption]) -> dict[str, ChildOption]:
    """Options by spelling; a spelling two runtimes know gets the stricter kind and the
    larger arity."""
    by_name: dict[str, ChildOption] = {}
    for table in tables:
        for opt in table:
            for name in opt.names:
                old = by_name.get(name)
                if old is None:
                    by_name[name] = opt
                    continue
                kind = max(old.kind, opt.kind, key=STRICTNESS.index)
                arity = MANY if MANY in (old.arity, opt.arity) else max(old.arity, opt.arity)
                by_name[name] = ChildOption(tuple(dict.fromkeys((*old.names, *opt.names))),
                                            kind, arity, old.env or opt.env)
    return by_name


LLAMA_SERVER_OPTIONS: tuple[ChildOption, ...] = tuple(_parse(_LLAMA_SERVER))
"""llama-server's options (llama.cpp of llama-cpp-python 0.3.36)."""
BUNDLED_OPTIONS: tuple[ChildOption, ...] = tuple(_parse(_BUNDLED))
"""llama_cpp.server's options, normalised."""
BY_NAME: dict[str, ChildOption] = _merge(list(LLAMA_SERVER_OPTIONS), list(BUNDLED_OPTIONS))
"""Every option of either runtime by each normalised spelling (the stricter kind of two)."""
BUNDLED_LITERAL: tuple[str, ...] = tuple(w for line in _BUNDLED.strip().splitlines()
                                         for w in line.split()[2:] if w.startswith("--"))
"""llama_cpp.server's long options as its argparse spells them (underscores)."""

API_ALLOWED: frozenset[str] = frozenset(n for n, o in BY_NAME.items() if o.kind == API)
"""Every spelling an API caller may pass (Swap's extra_args)."""
REFUSED: frozenset[str] = frozenset(n for n, o in BY_NAME.items()
                                    if o.kind in (OWNED, HOST, DOWNLOAD, EXITS))
"""Every spelling refused from any source."""
