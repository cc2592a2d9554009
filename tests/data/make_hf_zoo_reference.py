"""Regenerate hf_zoo_reference.json / .npz: every transformers text RoPE, run by its own code.

Run by hand, never by the test suite, with transformers and torch installed in a scratch
virtualenv outside the repository:

    /tmp/hfenv/bin/python tests/data/make_hf_zoo_reference.py

It walks transformers' model types (``CONFIG_MAPPING``, and the sub-configs' model types
it lacks), keeps those whose modeling module has a rotary embedding class built from that
config (by its annotation, else as the model transformers builds holds it), shrinks the
config, and for every layer type with its own RoPE runs the family's rotary module and
the function its attention applies, in float64 (torch's float32 is redirected to float64
while they run, so the truth is not rounded to float32). Each case stores the config as a dict
(``to_dict()``), the layer type and what the model returned for q and k, which are
rebuilt from ``seed`` by ``inputs()`` (the test has the same function), at the positions
in ``positions``. ``features`` says which features of the model's query head q covers
(MLA rotates ``q[..., qk_nope_head_dim:]``); ``hf_order`` is "deinterleaved"
where the model's interleaving apply function also permutes features to
[even | odd] (DeepSeek-V3 style), which the q.k product does not see.

Model types whose configs fastpe must refuse (multi-axis M-RoPE, vision towers,
composite configs, ...) are stored with the reason the generator saw; the test checks
that each raises a ValueError (or loads with its axes, for the multi-axis ones). A model
type with rotary code that the generator cannot run is listed under ``not_run`` with
the error and its config, which must be refused too: fastpe has not checked it.
``no_rope`` lists the model types whose modeling code has no rotary embedding at all, or
whose model, as transformers builds it from the default config, builds no rotary module
and calls no rotary function (``rotary_in_model``; fastpe._hf_models.NO_ROPE must be
that list).

Coverage is by construction: ``known`` is every model type transformers knows (the
config mapping and the model types of the sub-configs its default configs hold), and
fastpe refuses each one without a case here; config-only types run the module of their
class in the model mapping (``unmodelled``: those with none, or whose module does not
import in this venv); ``unnamed_sub_configs`` are sub-configs with an empty model type.
``layers`` maps each config with layers of different kinds to what the model
transformers builds for it did on a few tokens, per layer type: "rope", "nope" (no
layer of that type called a rotary apply function) or "mixed"; ``layer_rotation`` the
same per layer index: the rope_theta of the rotary module whose cos and sin the layer
applied, true where the trace cannot tell which, false where it applied none. A case
of a config whose layers differ there names in ``layer`` the layer its numbers are
(the first of its layer type that rotated with its rotary module's base). A ``/partial`` variant
sets partial_rotary_factor=0.5 where the default config sets none (the model's output
says whether the family reads it); ``/indexer`` cases are the lightning indexers'
rotations (``part``: "indexer").
"""

import ast
import contextlib
import importlib
import inspect
import json
import math
import re
import sys
import textwrap
import typing
import warnings
from pathlib import Path

import numpy as np
import torch

# transformers 5.25 depends on `kernels`, whose use_kernel_forward_from_hub turns each
# modeling file's apply function into an nn.Module instance that calls it: no longer a
# Python function that the walks below find (by inspect.isfunction) and trace, so every
# traced layer would read as NoPE. Hidden, transformers keeps its plain functions; the
# numbers are the same (the wrapper calls that function unless kernelize() swaps in a hub
# kernel, which nothing here does).
sys.modules["kernels"] = None
import transformers  # noqa: E402
from transformers import CONFIG_MAPPING  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES  # noqa: E402

OUTPUT = Path(__file__).with_name("hf_zoo_reference.json")
ARRAYS = Path(__file__).with_name("hf_zoo_reference.npz")

# Positions past every small original length the variants below use (dynamic, longrope).
POSITIONS = np.array([0, 3, 17, 300], dtype=np.int64)
SMALL = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
# MLA configs keep their own head widths (several derive head_dim from them).
SMALL_MLA = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4}


@contextlib.contextmanager
def float64_torch():
    """Make the rotary modules' explicit float32 (torch.float, .float()) compute in float64."""
    saved = (torch.float, torch.float32, torch.Tensor.float, torch.FloatTensor,
             torch.get_default_dtype())
    torch.float = torch.float64
    torch.float32 = torch.float64
    torch.Tensor.float = lambda self, *a, **k: self.to(torch.float64)
    torch.FloatTensor = lambda data: torch.tensor(data, dtype=torch.float64)
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.float, torch.float32, torch.Tensor.float, torch.FloatTensor = saved[:4]
        torch.set_default_dtype(saved[4])


def modeling_module(model_type, config_class):
    """The modeling module the model type runs: its own, or for a config-only type
    (sarvam_mla runs DeepseekV3Model) the module of its class in the model mapping.
    None where transformers has no model for it. The test refuses every model type
    without a case, so one whose module does not import here stays refused."""
    try:
        return importlib.import_module(config_class.__module__.replace("configuration_",
                                                                       "modeling_"))
    except ModuleNotFoundError:
        name = MODEL_MAPPING_NAMES.get(model_type)
        if name is None:
            return None
        return importlib.import_module(getattr(transformers, name).__module__)


def rotary_class(module, config_class):
    """(the module's rotary embedding built from exactly this config class, True), else
    (the one a sub-model builds from its own sub-config, False): Dia's decoder, CSM's
    depth decoder use a text rotary class whose config annotation is the parent's."""
    fallback = None
    for name, obj in vars(module).items():
        if inspect.isclass(obj) and obj.__module__ == module.__name__ and "Rotary" in name:
            param = inspect.signature(obj.__init__).parameters.get("config")
            ann = None if param is None else param.annotation
            ann = ann if isinstance(ann, str) else getattr(ann, "__name__", None)
            if ann == config_class.__name__:
                return obj, True
            if param is not None and "Vision" not in name and fallback is None:
                fallback = obj
    return fallback, False


def model_classes(model_type, config_class, module):
    """The classes transformers builds from this config class: its model in the model
    mapping, else every model class of the module for it (a sub-model: Moshi's depth
    decoder, an audio or vision tower), else the module's classes whose __init__ takes
    exactly this config class (Gemma 4 unified's vision embedder)."""
    name = MODEL_MAPPING_NAMES.get(model_type)
    if name is not None and hasattr(transformers, name):
        return [getattr(transformers, name)], True
    # its package's (IDEFICS keeps its vision tower and perceiver in modules of their own)
    package = module.__name__.rpartition(".")[0] + "."
    own = [obj for obj in vars(module).values() if inspect.isclass(obj)
           and issubclass(obj, torch.nn.Module) and obj.__module__.startswith(package)]
    models = [obj for obj in own if issubclass(obj, transformers.PreTrainedModel)
              and getattr(obj, "config_class", None) is config_class
              and not obj.__name__.endswith("PreTrainedModel")]
    if models:
        return models, True

    def takes(obj, union):
        try:
            params = inspect.signature(obj.__init__).parameters.values()
        except (TypeError, ValueError):
            return False
        return any(p.annotation is config_class or p.annotation == config_class.__name__
                   or (union and config_class in typing.get_args(p.annotation))
                   for p in params)
    exact = [obj for obj in own if takes(obj, False)]
    return exact or [obj for obj in own if takes(obj, True)] or read_from(config_class, own), False


def read_from(config_class, own):
    """The classes built from the values of a sub-config that no class takes whole: those
    called in a statement that reads the key its parent keeps it under (IDEFICS builds
    its perceiver resampler from ``perceiver_config.resampler_depth``, ...)."""
    keys = {key for parent in CONFIG_MAPPING.values()
            for key, cls in (getattr(parent, "sub_configs", None) or {}).items()
            if cls is config_class}
    if not keys:
        return []
    names = {obj.__name__: obj for obj in own}
    found = {}
    for obj in own:
        with contextlib.suppress(OSError, TypeError, SyntaxError):
            tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
            for node in ast.walk(tree):
                if not isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr,
                                         ast.Return)):
                    continue
                if not any(re.search(rf"\b{key}\b", ast.unparse(node)) for key in keys):
                    continue
                for call in ast.walk(node):
                    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                            and call.func.id in names):
                        found[call.func.id] = names[call.func.id]
    return list(found.values())


def rotary_names(module):
    """The module's rotary classes and functions (rotary embeddings, rotate_half, the
    apply functions), by name."""
    classes = {n for n, o in vars(module).items() if inspect.isclass(o)
               and o.__module__ == module.__name__ and re.search(r"rotary|rope", n, re.I)}
    functions = {n for n, o in vars(module).items() if inspect.isfunction(o)
                 and re.search(r"rotary|rope|rotate", n)}
    return classes, functions


def calls(source, names):
    return {n for n in names if re.search(rf"\b{re.escape(n)}\(", source)}


def rotary_by_config(source, classes):
    """Whether the source builds a rotary class under a condition on its config
    (the conformers' ``if config.position_embeddings_type == "rotary"``): what the
    default config builds does not then say what the model type does."""
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if calls(line, classes):
            near = " ".join(lines[max(0, i - 3):i + 1])
            if re.search(r"\bif\b[^:]*config", near):
                return True
    return False


def ran_rotary(model_class, config, module):
    """Whether the model, run on a few tokens, called a rotary function of its module
    (Moshi's depth decoder builds its attention with use_rope=False); None where it
    cannot be run from input ids alone."""
    _, functions = rotary_names(module)
    saved = {n: getattr(module, n) for n in functions}
    called = []

    def wrap(name, fn):
        def traced(*args, **kwargs):
            called.append(name)
            return fn(*args, **kwargs)
        return traced

    small = {k: v for k, v in TRACE_SMALL.items() if getattr(config, k, None) is not None}
    try:
        trace_config = type(config).from_dict({**config.to_dict(), **small})
        torch.manual_seed(0)
        model = model_class(trace_config).eval()
        for n, f in saved.items():
            setattr(module, n, wrap(n, f))
        seq = min(8, getattr(trace_config, "num_codebooks", None) or 8)
        kwargs = {"input_ids": torch.arange(1, seq + 1)[None] % trace_config.vocab_size}
        if "last_hidden_state" in inspect.signature(model.forward).parameters:
            # a depth decoder (Moshi's) also takes the main decoder's hidden states
            kwargs["last_hidden_state"] = torch.zeros(1, seq, trace_config.input_size)
        with torch.no_grad():
            model(**kwargs)
    except Exception:
        return None
    finally:
        for n, f in saved.items():
            setattr(module, n, f)
    return bool(called)


def rotary_in_model(model_type, config_class, module):
    """What the model transformers builds from this config does for positions in its
    attention, where the module's rotary classes do not say by their config annotation:
    the rotary class it builds from exactly this config (Qwen3-Omni's code predictor
    runs Qwen3-Omni's plain rotary module); "none" where it builds no rotary module and
    none of the classes it builds calls a rotary function (Jamba and Nemotron-H keep
    Llama's apply function unused, speech encoders have relative positions, vision
    towers learned ones), or where run it calls none; None where that cannot be told
    (the model is not built from this config alone, or runs rotary code without a
    rotary module)."""
    candidates, built = model_classes(model_type, config_class, module)
    if not candidates:
        return None
    package = module.__name__.rpartition(".")[0] + "."
    classes, functions = rotary_names(module)
    if not built:
        # Not built on its own (a part of a composite model): what its classes and those
        # they name build and call, from their source.
        sources = {n: inspect.getsource(o) for n, o in vars(module).items()
                   if inspect.isclass(o) and o.__module__.startswith(package)}
        tainted = {n for n, src in sources.items() if calls(src, classes | functions)}
        while True:
            more = {n for n, src in sources.items() if n not in tainted and calls(src, tainted)}
            if not more:
                break
            tainted |= more
        return None if any(c.__name__ in tainted for c in candidates) else "none"
    config = config_class()
    found, called = set(), set()
    try:
        for cls in candidates:
            with torch.device("meta"):
                model = cls(config)
            if any(rotary_by_config(inspect.getsource(type(sub)), classes)
                   for sub in model.modules() if type(sub).__module__.startswith(package)):
                return None  # another config of this type may build one
            for sub in model.modules():
                if type(sub).__name__ in classes or re.search(r"rotary|rope",
                                                              type(sub).__name__, re.I):
                    if getattr(sub, "config", None) is config:
                        found.add(type(sub))
                    else:
                        return None  # a sub-model's, or one holding no config
                with contextlib.suppress(TypeError, OSError):
                    called |= calls(inspect.getsource(type(sub).forward), functions)
    except Exception:
        return None
    if len(found) == 1:
        return found.pop()
    if found:
        return None
    if not called:
        return "none"
    if all(ran_rotary(cls, small_config(config_class), module) is False for cls in candidates):
        return "none"
    return None


def has_rotary_code(module):
    """Whether a modeling module mentions rotary embeddings at all."""
    source = inspect.getsource(module)
    return any(word in source for word in ("rotary", "Rotary", "rotate_half", "apply_rope",
                                           "RoPE", "rope_theta", "rope_parameters"))


def small_config(config_class, extra=None):
    defaults = config_class().to_dict()
    small = SMALL_MLA if "qk_rope_head_dim" in defaults else SMALL
    kwargs = {k: v for k, v in small.items() if k in defaults}
    kwargs.update(extra or {})
    try:
        return config_class(**kwargs)
    except Exception:
        return config_class(**(extra or {}))


def rope_layer_types(config):
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params and all(isinstance(v, dict) or v is None
                                                   for v in params.values()):
        keys = [k for k, v in params.items() if v is not None]
        # The modules build the layer types the model has (Laguna lists a type it never
        # uses); DeepSeek-V4 keys its rope by attention part instead ("main", "compress").
        # Sorted: a config class may build the dict from a set (Dory), whose order
        # changes from run to run with the string hash seed.
        used = [k for k in keys if k in set(getattr(config, "layer_types", None) or ())]
        return sorted(used or keys)
    return [None]


def refusal_reason(config, rot_cls):
    """Why fastpe's 1-D text loader must refuse this config, or None."""
    d = config.to_dict()
    subs = [k for k, v in d.items() if isinstance(v, dict)
            and k in (getattr(type(config), "sub_configs", None) or {})]
    if subs and not {"rope_parameters", "rope_scaling", "rope_theta"} & set(d):
        return "composite config: " + ", ".join(subs)
    kind = getattr(config, "position_embedding_type", None)
    if isinstance(kind, str) and "rot" not in kind and kind != "rope":
        return f"no RoPE: position_embedding_type={kind!r}"
    if "mrope" in inspect.getsource(rot_cls):
        return "multi-axis M-RoPE (mrope_section)"
    params = getattr(config, "rope_parameters", None) or {}
    flat = [params] if not all(isinstance(v, dict) for v in params.values()) else params.values()
    for p in flat:
        if p.get("rope_type") == "axial":
            return "vision (axial) RoPE"
        if "mrope_section" in p or p.get("mrope_interleaved") is not None:
            return "multi-axis M-RoPE (mrope_section)"
    return None


def attention_source(module, rot_cls):
    """The source of the attention classes that use this rotary module (same name
    prefix where there are several), less indexers (DeepSeek-V3.2's lightning indexer
    rotates its own, separate features)."""
    classes = {name: obj for name, obj in vars(module).items()
               if inspect.isclass(obj) and obj.__module__ == module.__name__
               and name.endswith("Attention") and "Indexer" not in name
               and "Vision" not in name}
    prefix = rot_cls.__name__.removesuffix("RotaryEmbedding")
    mine = [obj for name, obj in classes.items() if name.startswith(prefix)] or classes.values()
    return "".join(inspect.getsource(obj) for obj in mine)


def pick_apply(module, config, rot_cls):
    """The function the attention applies, and how it is called."""
    names = {n for n, o in vars(module).items() if inspect.isfunction(o)}
    calls = attention_source(module, rot_cls)
    interleave = "apply_rotary_pos_emb_interleave" in names and (
        "apply_rotary_pos_emb(" not in calls or ("apply_rotary_pos_emb_interleave(" in calls
        and ("rope_interleave" not in calls or getattr(config, "rope_interleave", False))))
    if interleave:
        return module.apply_rotary_pos_emb_interleave, "interleave"
    if "apply_rotary_emb" in names and "apply_rotary_pos_emb" not in names:
        return module.apply_rotary_emb, "complex"
    apply = getattr(module, "apply_rotary_pos_emb", None)
    params = list(inspect.signature(apply).parameters)
    if params[:3] == ["tensor", "sin", "cos"]:
        return apply, "sincos"  # GPT-J, CodeGen: one tensor, (b, s, h, d)
    if params[1:3] == ["cos", "sin"]:
        return apply, "single"  # one tensor at a time (Gemma 3n, DeepSeek-V4)
    return apply, "standard"


def mla_slice(config, layer_type):
    try:
        nope = getattr(config, "qk_nope_head_dim", None)
    except Exception:  # dots.llm3: a per-layer attribute, resolved per layer type
        nope = config.per_layer_config[layer_type].qk_nope_head_dim
    rope = getattr(config, "qk_rope_head_dim", None)
    if nope is None or rope is None:
        return None
    return [int(nope), int(nope + rope)]


def head_dim_of(config, layer_type):
    try:
        head = getattr(config, "head_dim", None)
    except Exception:  # Gemma 4: a per-layer attribute, resolved per layer type
        return config.per_layer_config[layer_type].head_dim
    if head is None and getattr(config, "num_attention_heads", None):
        head = config.hidden_size // config.num_attention_heads
    return head


def call_apply(apply, kind, out, q, k):
    """q, k: numpy (1, 1, seq, dim); returns the rotated pair as numpy."""
    if kind == "complex":
        # Llama 4 holds q as (b, s, h, d); DeepSeek-V2 as (b, h, s, d).
        bshd = "freqs_cis[:, :, None, :]" in inspect.getsource(apply)
        perm = (0, 2, 1, 3) if bshd else (0, 1, 2, 3)
        qo, ko = apply(torch.from_numpy(q.transpose(perm).copy()),
                       torch.from_numpy(k.transpose(perm).copy()), out)
        return qo.detach().numpy().transpose(perm), ko.detach().numpy().transpose(perm)
    if kind == "sincos":
        sin, cos = out
        return tuple(apply(torch.from_numpy(x.transpose(0, 2, 1, 3).copy()), sin, cos)
                     .detach().numpy().transpose(0, 2, 1, 3) for x in (q, k))
    if kind == "single":
        return tuple(apply(torch.from_numpy(x.copy()), out[0], out[1]).detach().numpy()
                     for x in (q, k))
    qo, ko = apply(torch.from_numpy(q.copy()), torch.from_numpy(k.copy()), out[0], out[1])[:2]
    return qo.detach().numpy(), ko.detach().numpy()


def inputs(seed, dim):
    """Deterministic q or k rows, (positions, dim), in [-1, 1): exact integer arithmetic and
    one IEEE division, so the test rebuilds them bit for bit without storing them."""
    p = np.arange(len(POSITIONS), dtype=np.int64)[:, None]
    j = np.arange(dim, dtype=np.int64)[None, :]
    return ((j * 7919 + p * 104729 + seed * 15485863) % 2003) / 1001.5 - 1.0


# An attention that cuts the leading rotary features out of q and k itself before its
# apply function sees them (Phi's q[..., : self.rotary_ndims], GPT-J's
# q[:, :, :, : self.rotary_dim]). Elsewhere, where the apply function fails on the whole
# head, so does the model (Apertus, Ministral 3 with a partial_rotary_factor).
CUTS_ROTARY = re.compile(r"\[[^\]\[]*:\s*self\.\w*rot\w*\s*\]")


def cuts_rotary(rot_cls):
    return bool(CUTS_ROTARY.search(attention_source(sys.modules[rot_cls.__module__], rot_cls)))


def run_case(config, rot_cls, apply, kind, layer_type, seed):
    with float64_torch():
        rot = rot_cls(config=config)
        kw = {} if layer_type is None else {"layer_type": layer_type}
        pos = torch.from_numpy(POSITIONS[None])
        out = rot(torch.zeros(1, dtype=torch.float64), pos, **kw)
        width = 2 * out.shape[-1] if kind == "complex" else out[0].shape[-1]
        if kind == "sincos":
            width *= 2
        head = head_dim_of(config, layer_type) or width
        sl = mla_slice(config, layer_type)
        # The apply function sees the rope part only (MLA), or the whole head and splits
        # off the rotated slice itself, or (Phi, StableLM, Persimmon, GPT-J) only the
        # leading slice its attention cut out.
        dim = width if sl is not None else head
        if sl is not None and width != sl[1] - sl[0]:
            # the attention hands the apply function its qk_rope_head_dim features
            raise RuntimeError(f"cos and sin of {width} features for a rope part of "
                               f"{sl[1] - sl[0]}")
        q = inputs(seed, dim)[None, None]
        k = inputs(seed + 1, dim)[None, None]
        try:
            qo, ko = call_apply(apply, kind, out, q, k)
        except (RuntimeError, TypeError):
            if sl is not None or width >= dim or not cuts_rotary(rot_cls):
                raise  # the model's own code fails on this config
            # The attention cut out the leading rotary features itself.
            qo, ko = call_apply(apply, kind, out, q[..., :width], k[..., :width])
            qo = np.concatenate([qo, q[..., width:]], axis=-1)
            ko = np.concatenate([ko, k[..., width:]], axis=-1)
        if qo.shape != q.shape:
            raise ValueError(f"apply returned {qo.shape} for {q.shape}")
        features = sl if sl is not None else [0, dim]
        return {"q": q, "k": k, "q_out": qo, "k_out": ko, "features": features}


# Sizes that keep a whole model small enough to build and run for the layer trace; only
# the keys a config already has are set (none of them changes its RoPE).
TRACE_SMALL = {"vocab_size": 256, "intermediate_size": 64, "moe_intermediate_size": 32,
               "num_experts": 4, "n_routed_experts": 4, "num_local_experts": 4,
               "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
               "shared_expert_intermediate_size": 32, "linear_num_key_heads": 2,
               "linear_num_value_heads": 2, "linear_key_head_dim": 16,
               "linear_value_head_dim": 16, "first_k_dense_replace": 0, "pad_token_id": 0}


# Config keys that say layers differ in kind (hybrid, NoPE or sliding layers): where a
# config has none, every layer runs the same attention, and the rotary module and apply
# function are the whole story.
LAYER_KEYS = ("layer_types", "layers_block_type", "no_rope_layers", "use_mem_rope",
              "position_embedding_type", "attn_layer_indices", "hybrid_override_pattern",
              "block_types", "layer_rope_theta")


# Sizes a config leaves None that its model needs to be built for the layer trace
# (Qwen4-Exp's QSA indexer); they change no RoPE.
TRACE_EXTRA = {"qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1,
                                  "indexer_head_dim": 32, "indexer_budget": 8,
                                  "indexer_compress_ratio": 4}}


def module_theta(module, args, kwargs):
    """The rope_theta a rotary module's call computes its cos and sin with (the layer
    type's, where it takes one), from its own config; None where it keeps none."""
    params = getattr(getattr(module, "config", None), "rope_parameters", None)
    if not isinstance(params, dict):
        return None
    layer_type = kwargs.get("layer_type", args[2] if len(args) > 2 else None)
    if isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    theta = params.get("rope_theta")
    return float(theta) if isinstance(theta, (int, float)) else None


def trace_layers(model_type, config):
    """({layer type: "rope" | "nope" | "mixed"}, [one entry per decoder layer]) from
    running the model transformers builds for this config on a few tokens and recording
    which decoder layers call a rotary apply function (outside an indexer), and with
    the output of which rotary module: per layer its rope_theta (a float), True where it
    rotated by a cos/sin the trace cannot trace to one module call, False where it did
    not rotate. None where the config has no layers of different kinds, or the model
    cannot be built or run from the config alone. Layers without ``layer_types`` count
    as one type, None."""
    name = MODEL_MAPPING_NAMES.get(model_type)
    if name is None or not any(k in config.to_dict() for k in LAYER_KEYS):
        return None
    model_class = getattr(transformers, name)
    defaults = config.to_dict()
    # getattr, and set again once built: a few keys are attributes that to_dict and
    # from_dict leave out (Bailing-hybrid's n_group)
    small = {k: v for k, v in TRACE_SMALL.items() if getattr(config, k, None) is not None}
    small.update(TRACE_EXTRA.get(model_type, {}))
    try:
        trace_config = type(config).from_dict({**defaults, **small})
        for key, value in small.items():
            setattr(trace_config, key, value)
        torch.manual_seed(0)
        model = model_class(trace_config).eval()
    except Exception:
        return None
    module = sys.modules[model_class.__module__]
    current, rotated, thetas, made = [None], set(), {}, {}

    def wrap(fn):
        def traced(*args, **kwargs):
            caller = sys._getframe(1).f_locals.get("self")
            if current[0] is not None and "Indexer" not in type(caller).__name__:
                rotated.add(current[0])
                seen = {made[id(a)] for a in (*args, *kwargs.values()) if id(a) in made}
                thetas.setdefault(current[0], set()).update(seen or {None})
            return fn(*args, **kwargs)
        return traced

    def keep(m, args, kwargs, out):
        # the ids of the tensors this call returned, with the theta they were made with
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                made[id(t)] = module_theta(m, args, kwargs)

    saved = {n: f for n, f in vars(module).items() if inspect.isfunction(f)
             and ("rotary" in n or "rope" in n) and not n.startswith("_compute")}
    layers = {}
    for mod_name, sub in model.named_modules():
        parts = mod_name.split(".")
        if len(parts) >= 2 and parts[-2] == "layers" and parts[-1].isdigit():
            layers.setdefault(int(parts[-1]), sub)
        if type(sub).__name__.endswith("RotaryEmbedding") and "Vision" not in type(sub).__name__:
            sub.register_forward_hook(keep, with_kwargs=True)
    if not layers:
        return None
    for idx, sub in layers.items():
        sub.register_forward_pre_hook(lambda m, a, i=idx: current.__setitem__(0, i))
    try:
        for n, f in saved.items():
            setattr(module, n, wrap(f))
        with torch.no_grad():
            ids = torch.arange(1, 9)[None] % trace_config.vocab_size
            try:
                model(input_ids=ids, use_cache=False)
            except TypeError:
                rotated.clear()
                thetas.clear()
                model(input_ids=ids)
    except Exception:
        return None
    finally:
        for n, f in saved.items():
            setattr(module, n, f)
    kinds = getattr(trace_config, "layer_types", None) or [None] * len(layers)
    result = {}
    for idx in layers:
        kind = kinds[idx] if idx < len(kinds) else None
        state = "rope" if idx in rotated else "nope"
        result[kind] = state if result.get(kind, state) == state else "mixed"
    per_layer = []
    for idx in sorted(layers):
        seen = thetas.get(idx, set())
        per_layer.append(False if idx not in rotated else
                         next(iter(seen)) if len(seen) == 1 and None not in seen else True)
    return result, per_layer


# Conformer speech encoders rotate their hidden states (heads of the input to the q and
# k projections) with their own module and method, at positions 0 .. seq - 1.
CONFORMERS = {
    "wav2vec2-conformer": ("Wav2Vec2ConformerRotaryPositionalEmbedding",
                           "Wav2Vec2ConformerSelfAttention", "num_attention_heads"),
    "wav2vec2-bert": ("Wav2Vec2BertRotaryPositionalEmbedding", "Wav2Vec2BertSelfAttention",
                      "num_attention_heads"),
    # SeamlessM4T's only RoPE is its speech encoder's
    "seamless_m4t": ("SeamlessM4TConformerRotaryPositionalEmbedding",
                     "SeamlessM4TConformerSelfAttention", "speech_encoder_attention_heads"),
}


def run_conformer(module, config, names, seed):
    rot_cls, attention_cls = (getattr(module, n) for n in names[:2])
    heads = getattr(config, names[2])
    dim = config.hidden_size // heads
    seq = int(POSITIONS.max()) + 1
    got = {}
    with float64_torch():
        attention = attention_cls(config)
        for field, s in (("q", seed), ("k", seed + 1)):
            hidden = torch.zeros(1, seq, heads, dim)
            hidden[0, torch.from_numpy(POSITIONS), 0] = torch.from_numpy(inputs(s, dim))
            hidden = hidden.reshape(1, seq, heads * dim)
            emb = rot_cls(config)(hidden)
            out = attention._apply_rotary_embedding(hidden, emb).reshape(1, seq, heads, dim)
            got[field] = inputs(s, dim)
            got[field + "_out"] = out[0, torch.from_numpy(POSITIONS), 0].detach().numpy()
    return {k: v[None, None] for k, v in got.items()} | {"features": [0, dim]}


def run_roformer(module, config, seed):
    """RoFormer's table (its sinusoidal module) through its attention's rotation."""
    dim = config.hidden_size // config.num_attention_heads
    with float64_torch():
        table = module.RoFormerSinusoidalPositionalEmbedding(config.max_position_embeddings,
                                                             dim).create_weight()
        sinusoidal_pos = table[torch.from_numpy(POSITIONS)][None, None]
        q, k = inputs(seed, dim), inputs(seed + 1, dim)
        qo, ko = module.RoFormerSelfAttention.apply_rotary_position_embeddings(
            sinusoidal_pos, torch.from_numpy(q)[None, None], torch.from_numpy(k)[None, None])
    return {"q_out": qo.numpy(), "k_out": ko.numpy(), "features": [0, dim]}


def run_clvp(module, config, seed):
    """CLVP's encoder: its rotary module's angles over positions 0 .. seq - 1, indexed by
    position_ids in its apply function, on the leading features of q, k (and v) that
    the angles cover, max(projection_dim // (2 * num_attention_heads), 32) of them."""
    dim = config.hidden_size // config.num_attention_heads
    seq = int(POSITIONS.max()) + 1
    with float64_torch():
        angles = module.ClvpRotaryPositionalEmbedding(config)(torch.zeros(1, seq, dim))
        width = angles.shape[-1]
        cos, sin = angles.cos().squeeze(0), angles.sin().squeeze(0)
        q, k = inputs(seed, dim), inputs(seed + 1, dim)
        rotated = module.apply_rotary_pos_emb(
            *(torch.from_numpy(x[:, :width])[None, None] for x in (q, k, q)), cos, sin,
            torch.from_numpy(POSITIONS)[None])
        qo, ko = (np.concatenate([r.numpy()[0, 0], x[:, width:]], axis=-1)
                  for r, x in zip(rotated[:2], (q, k)))
    return {"q_out": qo[None, None], "k_out": ko[None, None], "features": [0, dim]}


# Families that rotate by a module and method of their own, run by the functions above,
# with the configs (variant, settings) they run on.
OWN_ROTATION = {
    "roformer": (run_roformer, [("default", None)]),
    # heads of 64 features: a rotated width of 48 from projection_dim, and the floor of 32
    "clvp_encoder": (run_clvp, [("default", {"hidden_size": 256, "projection_dim": 384}),
                                ("floor", {"hidden_size": 256, "projection_dim": 128})]),
}


def json_safe(obj):
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return repr(obj)


# Keys whose None is not their absence: a config.json that transformers writes leaves out
# a key at its class default, and these decide per layer whether it rotates (Cohere 2's
# sliding layers rotate only with a window; EXAONE 4's every layer without one).
KEEP_NONE = ("sliding_window",)


def ordered_rope(d):
    """d with every rope_parameters dict that has one entry per layer type (its
    sub-configs' too) in a fixed order: config classes build some from a set (Dory,
    dots.llm3), whose order changes from run to run with the string hash seed."""
    if not isinstance(d, dict):
        return d
    out = {k: ordered_rope(v) for k, v in d.items()}
    rope = out.get("rope_parameters")
    if isinstance(rope, dict) and rope and all(isinstance(v, dict) or v is None
                                               for v in rope.values()):
        out["rope_parameters"] = dict(sorted(rope.items()))
    return out


def config_dict(config):
    d = config.to_dict()
    # Drop bulky fields that no RoPE reads; keep everything else a user's dict would have
    # (layer_types and the per-layer lists whole: from_hf_config(config, layer=i) reads
    # layer i's entries).
    for key in ("id2label", "label2id", "task_specific_params",
                "num_attention_heads_per_layer", "transformers_version",
                "architectures", "auto_map", "tokenizer_class", "dtype"):
        d.pop(key, None)
    d = ordered_rope(d)
    # None reads as absent everywhere a config is read; leaving it out keeps the file small.
    return json_safe({k: v for k, v in d.items() if v is not None or k in KEEP_NONE})


# Variants beyond each family's default config: the scaling types the families ship with.
# Default configs that the small head width would make odd (int(32 * 0.8) = 25).
SMALL_EXTRA = {"moonshine_streaming": {"head_dim": 40}}

def _phimoe(rope_type, original, name=None, **params):
    """PhiMoE with a rope type of its own: its module multiplies cos and sin by
    short_mscale or long_mscale (past original) for every type but default."""
    return (name or f"{rope_type}_mscale_{original}", {
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": rope_type, "rope_theta": 10000.0,
                            "short_mscale": 1.243, "long_mscale": 1.118,
                            "original_max_position_embeddings": original, **params}})


# The settings without which a family's default config rotates nothing: the variants
# below (partial, scaled, unscaled, entry_partial) are made on top of them.
ENABLES = {
    "zamba2": ("mem_rope", {"use_mem_rope": True}),
    # Bamba's default config has no attention layers at all
    "bamba": ("attention", {"attn_layer_indices": [1], "num_hidden_layers": 2}),
    "granitemoehybrid": ("rope", {"position_embedding_type": "rope", "num_hidden_layers": 2,
                                  "layer_types": ["linear_attention", "full_attention"]}),
}


def variant_base(model_type):
    """The settings every derived variant of a family starts from."""
    return {**(SMALL_EXTRA.get(model_type) or {}), **ENABLES.get(model_type, ("", {}))[1]}


VARIANTS = {
    # ESM's rotary module reads the top-level rope_theta only: the rope dict is not its
    "esm": [("rotary", {"position_embedding_type": "rotary"}),
            ("rotary_dict_unread", {"position_embedding_type": "rotary", "rope_theta": 500.0,
                                    "rope_parameters": {"rope_type": "linear", "factor": 4.0,
                                                        "rope_theta": 100.0}})],
    "deepseek_v2": [("yarn", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32,
        "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 128}})],
    "deepseek_v3": [("yarn", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 128}}),
        ("no_interleave", {"rope_interleave": False})],
    "phi3": [("longrope", {"max_position_embeddings": 4096, "original_max_position_embeddings": 128,
                           "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                               "short_factor": [1.0 + i / 40 for i in range(16)],
                                               "long_factor": [2.0 + i for i in range(16)]}})],
    "phimoe": [*[_phimoe("longrope", original, name=name,
                         short_factor=[1.0 + i / 40 for i in range(16)],
                         long_factor=[2.0 + i for i in range(16)])
                 for name, original in (("longrope_mscale", 128),
                                        ("longrope_mscale_short", 512))],
               *[_phimoe(t, original, **params) for original in (128, 512) for t, params in (
                   ("linear", {"factor": 4.0}), ("dynamic", {"factor": 4.0}),
                   ("yarn", {"factor": 4.0}),
                   ("llama3", {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}))]],
    # transformers' dynamic NTK takes its original length from max_position_embeddings,
    # whatever the rope dict says (also under the legacy "type" key)
    "llama": [("dynamic", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0,
                                               "factor": 2.0}, "max_position_embeddings": 64}),
              ("dynamic_original", {"rope_parameters": {
                  "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0,
                  "original_max_position_embeddings": 16}, "max_position_embeddings": 64}),
              ("dynamic_legacy_type", {"rope_scaling": {
                  "type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16},
                  "max_position_embeddings": 64}),
              ("linear", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0,
                                              "factor": 4.0}})],
    # DBRX keeps its length under max_seq_len (attribute_map: max_position_embeddings)
    "dbrx": [("dynamic", {"max_seq_len": 64, "rope_parameters": {
        "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}})],
    **{mt: [(name, settings)] for mt, (name, settings) in ENABLES.items()},
    "qwen2": [("yarn", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                            "original_max_position_embeddings": 128}})],
    # Layers that differ by index in whether, or with which base, they rotate: the
    # per-layer trace says what each layer of these did.
    "smollm3": [("no_rope_layers", {"num_hidden_layers": 4, "no_rope_layers": [1, 0, 0, 1]}),
                ("all_rope", {"num_hidden_layers": 4, "no_rope_layers": [1, 1, 1, 1]})],
    # without a chunk size every layer is "full_attention", every 4th one NoPE
    "llama4_text": [("llama3_x8", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
        ("no_chunk", {"attention_chunk_size": None})],
    # without a window every layer rotates, full attention too (with sliding layers, or
    # in Cohere 2 and Kolibri at all, the model's sliding mask needs one)
    "exaone4": [("no_window", {"sliding_window": None, "num_hidden_layers": 4,
                               "layer_types": ["full_attention"] * 4})],
    # dense prefix layers rotate (force_rope) although they are full attention
    "cohere2_moe": [("dense_prefix", {"first_k_dense_replace": 2})],
    # a base per layer, 0 for NoPE (Granite SWA rotates each layer with its own; the Muse
    # models only test it for 0)
    **{mt: [("layer_theta", {"num_hidden_layers": 4,
                             "layer_rope_theta": [10000.0, 0, 500000.0, 10000.0]})]
       for mt in ("granite_swa", "granitemoe_swa", "muse_spark_text", "muse_glimmer_text")},
}


def partial_variant(config_class, model_type):
    """A partial_rotary_factor of 0.5 where the default config sets none: whether the
    family's rotary module reads it is its code's to say, not the key's."""
    if model_type in CONFORMERS or model_type in OWN_ROTATION:
        return []
    try:
        defaults = config_class().to_dict()
    except Exception:
        return []
    if "qk_rope_head_dim" in defaults or any(
            k in defaults and defaults[k] is not None
            for k in ("partial_rotary_factor", "rotary_pct", "rotary_dim")):
        return []
    params = defaults.get("rope_parameters")
    nested = [params] if not isinstance(params, dict) else (
        list(params.values()) if params and all(isinstance(v, dict) or v is None
                                                for v in params.values()) else [params])
    if any(isinstance(p, dict) and p.get("partial_rotary_factor") is not None for p in nested):
        return []
    return [("partial", {**variant_base(model_type), "partial_rotary_factor": 0.5})]


def one_axis_rope_parameters(config_class, model_type):
    """The rope parameters of the family's default config, None where they are absent,
    multi-axis, or the family's rotation is not its rotary module's."""
    if model_type in CONFORMERS or model_type in OWN_ROTATION:
        return None
    try:
        params = config_class(**(SMALL_EXTRA.get(model_type) or {})).to_dict().get(
            "rope_parameters")
    except Exception:
        return None
    if not isinstance(params, dict) or not params or "mrope_section" in str(params):
        return None
    return params


def entry_partial_variant(config_class, model_type):
    """With rope parameters per layer type: partial_rotary_factor=0.5 in each default-type
    entry that has none (the top-level factor of partial_variant does not reach those),
    so that the family's own default-type frequencies and attention say what it does."""
    params = one_axis_rope_parameters(config_class, model_type)
    if params is None or not all(isinstance(v, dict) or v is None for v in params.values()):
        return []
    narrowed = {t: {**e, "partial_rotary_factor": 0.5} if isinstance(e, dict) and e.get(
        "rope_type", "default") == "default" and e.get("partial_rotary_factor") is None else e
        for t, e in params.items()}
    if narrowed == params:
        return []
    return [("entry_partial", {**variant_base(model_type), "rope_parameters": narrowed})]


def unscaled_variant(config_class, model_type):
    """Where the default config scales (YaRN, llama3, ...): the same base with the default
    rope type, each layer type's entry too (proportional and vision ones kept), as the
    family's own default-type frequencies and attention make it."""
    params = one_axis_rope_parameters(config_class, model_type)
    if params is None:
        return []
    plain = lambda e: e if not isinstance(e, dict) or e.get("rope_type", "default") not in (  # noqa: E731
        "linear", "dynamic", "yarn", "longrope", "llama3") else {"rope_type": "default",
                                                               "rope_theta": e.get("rope_theta")}
    if all(isinstance(v, dict) or v is None for v in params.values()):
        unscaled = {t: plain(e) for t, e in params.items()}
    else:
        unscaled = plain(params)
    if unscaled == params:
        return []
    return [("unscaled", {**variant_base(model_type), "rope_parameters": unscaled})]


def scaled_variant(config_class, model_type):
    """The default config's rope parameters as linear position interpolation (factor 2,
    each layer type's entry of the default type): whether the family's rotary module reads
    them, and what it does with them, is its code's to say (ESM's reads none, PhiMoE's
    multiplies by its mscales). Multi-axis configs, and families that have variants of
    their own scaled types, have none."""
    params = one_axis_rope_parameters(config_class, model_type)
    if params is None or (model_type in VARIANTS and model_type not in ENABLES):
        return []
    linear = {"rope_type": "linear", "factor": 2.0}
    if all(isinstance(v, dict) or v is None for v in params.values()):
        scaled = {t: {**e, **linear} if isinstance(e, dict) and e.get(
            "rope_type", "default") == "default" else e for t, e in params.items()}
    elif params.get("rope_type", "default") == "default":
        scaled = {**params, **linear}
    else:
        return []
    return [("scaled", {**variant_base(model_type), "rope_parameters": scaled})]


# Lightning indexers (DeepSeek-V3.2 sparse attention) that rotate their own q and k
# with the main attention's cos and sin.
INDEXERS = ("deepseek_v32", "axk2", "glm_moe_dsa", "hy_v4")


def run_indexer(module, config, rot_cls, seed):
    """The indexer's rotation: its own apply function (rotate_half or interleaved) on the
    qk_rope_head_dim features it splits off its head (leading or trailing)."""
    source = "".join(inspect.getsource(obj) for name, obj in vars(module).items()
                     if inspect.isclass(obj) and name.endswith("Indexer"))
    interleave = "apply_rotary_pos_emb_interleave(" in source
    apply = module.apply_rotary_pos_emb_interleave if interleave else module.apply_rotary_pos_emb
    trailing = "q_pass, q_rot = torch.split" in source
    rope, head = int(config.qk_rope_head_dim), int(config.index_head_dim)
    with float64_torch():
        cos, sin = rot_cls(config=config)(torch.zeros(1, dtype=torch.float64),
                                          torch.from_numpy(POSITIONS[None]))
        q, k = inputs(seed, rope), inputs(seed + 1, rope)
        qo, ko = apply(torch.from_numpy(q)[None, :, None], torch.from_numpy(k)[None, :, None],
                       cos, sin, unsqueeze_dim=2)
    return {"q_out": qo.numpy()[:, :, 0][None], "k_out": ko.numpy()[:, :, 0][None],
            "features": [head - rope, head] if trailing else [0, rope],
            "hf_order": "deinterleaved" if interleave else "same"}


# Sub-configs' model types that the config mapping lacks (Bark's semantic, coarse and
# fine acoustics models), with their config classes, as known_model_types() finds them.
SUB_CONFIG_CLASSES = {}


def known_model_types():
    """Every model type transformers knows: its config mapping and the model types of the
    sub-configs its default configs hold; and the sub-configs it gives no model type
    (an empty one), which the test checks are refused."""
    known, unnamed = set(CONFIG_MAPPING.keys()), []

    def walk(config, path):
        for key in getattr(type(config), "sub_configs", None) or {}:
            sub = getattr(config, key, None)
            if sub is None or not hasattr(sub, "to_dict"):
                continue
            if sub.model_type:
                known.add(sub.model_type)
                if sub.model_type not in CONFIG_MAPPING:
                    SUB_CONFIG_CLASSES.setdefault(sub.model_type, type(sub))
            else:
                unnamed.append({"name": f"{path}.{key}", "config": config_dict(sub)})
            walk(sub, f"{path}.{key}")

    for model_type in CONFIG_MAPPING.keys():
        try:
            walk(CONFIG_MAPPING[model_type](), model_type)
        except Exception:
            continue
    return {"known": sorted(known), "unnamed_sub_configs": unnamed}


def case_layer(config, per_layer, layer_type):
    """The layer index a case's numbers are the rotation of, where the traced layers of
    its config differ (some use no RoPE, or rotate with bases of their own): the first
    that rotated, of the case's layer type, with the base of the rotary module the case
    ran; None where every layer rotates alike (the config needs no layer=), False where
    no layer matches."""
    if per_layer is None or (False not in per_layer and len(
            {v for v in per_layer if v is not True}) <= 1):
        return None
    params = config.rope_parameters
    if layer_type is not None:
        params = params[layer_type]
    theta = params.get("rope_theta")
    kinds = getattr(config, "layer_types", None) or [None] * len(per_layer)
    for i, v in enumerate(per_layer):
        if v is not False and (layer_type is None or kinds[i] == layer_type) and (
                v is True or v == theta):
            return i
    return False


def main():
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    only = set(sys.argv[1:])
    cases, refusals, not_run, arrays, no_rope = [], [], {}, {}, []
    layers, layer_rotation, unmodelled = {}, {}, []
    document_known = known_model_types()
    config_classes = {**dict(CONFIG_MAPPING.items()), **SUB_CONFIG_CLASSES}
    for model_type, config_class in config_classes.items():
        if only and model_type not in only:
            continue
        try:
            module = modeling_module(model_type, config_class)
        except Exception:  # needs packages the generator's venv lacks (torchaudio)
            module = None
        if module is None:
            unmodelled.append(model_type)
            continue
        if not has_rotary_code(module) and not getattr(config_class, "sub_configs", None):
            no_rope.append(model_type)
            continue
        rot_cls, own = rotary_class(module, config_class)
        if not own and not getattr(config_class, "sub_configs", None) and (
                model_type not in CONFORMERS and model_type not in OWN_ROTATION):
            use = rotary_in_model(model_type, config_class, module)
            if use == "none":
                no_rope.append(model_type)
                continue
            if use is not None and use is not rot_cls and use.__name__.endswith(
                    "RotaryEmbedding"):
                rot_cls, own = use, True
        if model_type in CONFORMERS or model_type in OWN_ROTATION:
            runs = [(f"{model_type}/rotary", {"position_embeddings_type": "rotary",
                                              "rotary_embedding_base": 5000})]
            if model_type in OWN_ROTATION:
                runs = [(model_type if v == "default" else f"{model_type}/{v}", extra)
                        for v, extra in OWN_ROTATION[model_type][1]]
            for case_name, extra in runs:
                seed = 2 * len(cases)
                config = small_config(config_class, extra)
                if model_type in OWN_ROTATION:
                    got = OWN_ROTATION[model_type][0](module, config, seed)
                else:
                    got = run_conformer(module, config, CONFORMERS[model_type], seed)
                key = f"c{len(cases)}"
                for field in ("q_out", "k_out"):
                    arrays[f"{key}_{field}"] = got[field][0, 0]
                cases.append({"name": case_name, "key": key, "seed": seed,
                              "model_type": model_type, "layer_type": None,
                              "features": got["features"], "hf_order": "same",
                              "config": config_dict(config)})
            if model_type in CONFORMERS:
                refusals.append({"name": model_type, "reason": "no RoPE: relative positions",
                                 "config": config_dict(small_config(config_class))})
            continue
        if rot_cls is None:
            continue
        variants = [("default", SMALL_EXTRA.get(model_type))] + VARIANTS.get(model_type, [])
        variants += partial_variant(config_class, model_type)
        variants += scaled_variant(config_class, model_type)
        variants += entry_partial_variant(config_class, model_type)
        variants += unscaled_variant(config_class, model_type)
        for variant, extra in variants:
            name = model_type if variant == "default" else f"{model_type}/{variant}"
            try:
                config = small_config(config_class, extra)
                # multi-axis text models too: their NoPE layers are refused by layer type
                traced, per_layer = trace_layers(model_type, config) or (None, None)
                if traced is not None:
                    layers[name] = traced
                    layer_rotation[name] = per_layer
                reason = refusal_reason(config, rot_cls)
                if reason is not None and not own:
                    raise ValueError(f"{rot_cls.__name__} is not this config's: {reason}")
                if traced is not None and "rope" not in traced.values() and (
                        "mixed" not in traced.values()):
                    reason = "no layer applies a rotary embedding"
                if reason is not None:
                    refusals.append({"name": name, "reason": reason,
                                     "config": config_dict(config)})
                    continue
                apply, kind = pick_apply(module, config, rot_cls)
                if model_type in INDEXERS and variant == "default":
                    seed = 2 * len(cases)
                    got = run_indexer(module, config, rot_cls, seed)
                    key = f"c{len(cases)}"
                    for field in ("q_out", "k_out"):
                        arrays[f"{key}_{field}"] = got[field][0, 0]
                    cases.append({"name": f"{name}/indexer", "key": key, "seed": seed,
                                  "model_type": model_type, "layer_type": None,
                                  "part": "indexer", "features": got["features"],
                                  "hf_order": got["hf_order"], "config": config_dict(config)})
                for layer_type in rope_layer_types(config):
                    if (traced or {}).get(layer_type) == "nope":
                        continue
                    layer = case_layer(config, per_layer, layer_type)
                    if layer is False:
                        continue  # no layer rotates with this rotary module's output
                    seed = 2 * len(cases)
                    got = run_case(config, rot_cls, apply, kind, layer_type, seed)
                    case_name = name if layer_type is None else f"{name}[{layer_type}]"
                    key = f"c{len(cases)}"
                    for field in ("q_out", "k_out"):
                        arrays[f"{key}_{field}"] = got[field][0, 0]
                    cases.append({"name": case_name, "key": key, "seed": seed,
                                  "model_type": model_type,
                                  "layer_type": layer_type, "layer": layer,
                                  "features": got["features"],
                                  "hf_order": "deinterleaved" if kind == "interleave" else "same",
                                  "config": config_dict(config)})
            except Exception as exc:
                try:
                    stored = config_dict(small_config(config_class, extra))
                except Exception:
                    stored = {"model_type": model_type}
                not_run[name] = {"error": f"{type(exc).__name__}: {exc}"[:300], "config": stored}
        print(model_type, "ok" if model_type not in not_run else not_run[model_type]["error"][:100],
              flush=True)
    document = {
        "generated_by": "tests/data/make_hf_zoo_reference.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "positions": POSITIONS.tolist(),
        "note": "q = inputs(seed), k = inputs(seed + 1) as in inputs() here; the model's "
                "outputs in hf_zoo_reference.npz as <key>_q_out, <key>_k_out, "
                "(positions, dim) float64",
        "cases": cases,
        "refusals": refusals,
        "not_run": not_run,
        "no_rope": sorted(no_rope),
        "layers": layers,
        "layer_rotation": layer_rotation,
        "unmodelled": sorted(unmodelled),
        **document_known,
    }
    OUTPUT.write_text(json.dumps(document, indent=None, separators=(",", ":")) + "\n")
    np.savez_compressed(ARRAYS, **arrays)
    print(f"wrote {len(cases)} cases, {len(refusals)} refusals, {len(not_run)} not run")


if __name__ == "__main__":
    main()
