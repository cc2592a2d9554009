"""fastpe.hf.patch / unpatch on small random-weight transformers models.

The truth is each model's own transformers code (the stock model in the same
process) and, at 2**20 positions, the RoPE formula in float64 (Su et al., 2021):
rotate pair (j, j + r/2) by position * base**(-2j/r). Nothing is downloaded: every
model is built from a tiny config. Skipped without torch and transformers (the
"hf" extra).
"""

import copy
import inspect
import json
import textwrap
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import fastpe  # noqa: E402
import fastpe.hf  # noqa: E402

SMALL = dict(vocab_size=160, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
HEAD_DIM = 16
IMAGE_TOKEN = 150


def text_model(model_type, **extra):
    config = transformers.AutoConfig.for_model(model_type, **{**SMALL, **extra})
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def gemma3n():
    """Gemma 3n's text model: apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=2) on q
    and k one at a time, as (batch, seq, heads, dim); the last 2 layers reuse the
    keys of earlier ones."""
    config = transformers.Gemma3nTextConfig(
        **{**SMALL, "num_hidden_layers": 4}, head_dim=HEAD_DIM, sliding_window=4,
        vocab_size_per_layer_input=SMALL["vocab_size"], hidden_size_per_layer_input=8,
        layer_types=["sliding_attention", "full_attention"] * 2, num_kv_shared_layers=2,
        laurel_rank=4, altup_num_inputs=2, activation_sparsity_pattern=[0.0] * 4)
    torch.manual_seed(0)
    return transformers.Gemma3nForCausalLM(config).eval()


def qwen2_vl():
    config = transformers.Qwen2VLConfig(
        text_config=dict(SMALL, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                 "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2,
                           patch_size=4, temporal_patch_size=2, spatial_merge_size=2),
        image_token_id=IMAGE_TOKEN, video_token_id=151, vision_start_token_id=152,
        vision_end_token_id=153)
    torch.manual_seed(0)
    return transformers.Qwen2VLForConditionalGeneration(config).eval()


# family -> (model builder, the config's RoPE for the float64 reference: base, rotated
# features of the 16-wide head, M-RoPE sections in pairs or None)
FAMILIES = {
    "llama": (lambda: text_model("llama"), (10000.0, 16, None)),
    "qwen2": (lambda: text_model("qwen2", rope_parameters={"rope_type": "default",
                                                          "rope_theta": 1e6}), (1e6, 16, None)),
    "gemma2": (lambda: text_model("gemma2", head_dim=HEAD_DIM, sliding_window=4),
               (10000.0, 16, None)),
    # sliding layers at rope_theta 1e4, full layers at 1e6: each layer its own
    "gemma3": (lambda: text_model("gemma3_text", head_dim=HEAD_DIM, sliding_window=4,
                                  layer_types=["sliding_attention", "full_attention"]), None),
    # half the features rotate (partial_rotary_factor), inside the apply function
    "phi3": (lambda: text_model("phi3", partial_rotary_factor=0.5), (10000.0, 8, None)),
    # Phi slices the rotated features off before its apply function
    "phi": (lambda: text_model("phi", partial_rotary_factor=0.5), None),
    "qwen2_vl": (qwen2_vl, (1e6, 16, (2, 3, 3))),
    "mistral": (lambda: text_model("mistral"), None),
    "gpt_neox": (lambda: text_model("gpt_neox", rotary_pct=0.25), None),
    "stablelm": (lambda: text_model("stablelm", partial_rotary_factor=0.25), None),
    # GPT-J and CodeGen: a module that looks (sin, cos) up in a float32 table, an apply
    # function (x, sin, cos) called on q's and k's first rotary_dim features, adjacent
    # pairs; CodeGen's q, k and v come out of one interleaved projection
    "gptj": (lambda: text_model("gptj", rotary_dim=8), None),
    "codegen": (lambda: text_model("codegen", rotary_dim=8), None),
    # one complex freqs_cis in place of (cos, sin), moved to q's device, adjacent pairs:
    # DeepSeek-V2's latent attention (q, k as (batch, heads, seq, dim)) and Llama 4's text
    # model ((batch, seq, heads, dim)), its mixture of experts and chunked attention
    "deepseek_v2": (lambda: text_model(
        "deepseek_v2", num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, moe_intermediate_size=32,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, eos_token_id=None), None),
    "llama4": (lambda: text_model("llama4_text", head_dim=HEAD_DIM, intermediate_size_mlp=128,
                                  num_local_experts=2, eos_token_id=None), None),
    # Llama 4 Scout's llama3 scaling: equal low and high factors, no blended band
    "llama4_scout": (lambda: text_model(
        "llama4_text", head_dim=HEAD_DIM, intermediate_size_mlp=128, num_local_experts=2,
        eos_token_id=None, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 1.0,
            "original_max_position_embeddings": 8}), None),
    # JetMoE keeps head_dim as kv_channels (its class default 128 does not apply)
    "jetmoe": (lambda: text_model("jetmoe", kv_channels=16, num_local_experts=4,
                                  num_experts_per_tok=2), None),
    # adjacent pairs (from_hf_config's "gptj" style)
    "cohere": (lambda: text_model("cohere"), None),
    # scalings whose frequencies change past the original length, which the 16
    # positions of prompt and decoding cross
    "phi3_longrope": (lambda: text_model("phi3", max_position_embeddings=64, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.1 * i for i in range(8)],
        "long_factor": [2.0 + 0.5 * i for i in range(8)],
        "original_max_position_embeddings": 12}), None),
    "llama_dynamic": (lambda: text_model("llama", max_position_embeddings=12, rope_parameters={
        "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}), None),
    "llama3": (lambda: text_model("llama", rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8}), None),
    # multi-head latent attention: the apply function gets q's rope part and the one
    # shared k_pe head, and interleaves their features
    "deepseek_v3": (lambda: text_model(
        "deepseek_v3", num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, moe_intermediate_size=32,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1), None),
    # one rotary module per layer type, in a list beside the layers
    "granite_swa": (lambda: text_model("granite_swa"), None),
    # one rotary module per base of layer_rope_theta: each layer rotates at its own
    "granite_swa_bases": (lambda: text_model("granite_swa",
                                             layer_rope_theta=[10000.0, 500000.0]), None),
    "gemma3n": (gemma3n, None),
    # full layers: 512-wide heads (Gemma 4's default), proportional RoPE on a quarter
    "gemma4": (lambda: text_model("gemma4_text", head_dim=HEAD_DIM, sliding_window=4,
                                  layer_types=["sliding_attention", "full_attention"]), None),
    # SmolLM3's layer 1 uses no RoPE (no_rope_layers 0): its attention calls no apply
    # function, so fastpe rotates layer 0 alone
    "smollm3": (lambda: text_model("smollm3", no_rope_layers=[1, 0]), None),
    # Cohere 2's full-attention layer uses none either
    "cohere2": (lambda: text_model("cohere2", sliding_window=4,
                                   layer_types=["sliding_attention", "full_attention"]), None),
    # an attention scaling (YaRN's mscale) on cos and sin
    "qwen2_yarn": (lambda: text_model("qwen2", rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
        "original_max_position_embeddings": 8}), None),
    # Phi-3.5-MoE's short_mscale / long_mscale on cos and sin (every type but default),
    # switching past the 8 prompt tokens, frequencies of no length (longrope: short factors)
    **{f"phimoe_{rope_type}": (lambda extra=extra: text_model("phimoe", rope_parameters={
        "rope_theta": 10000.0, "short_mscale": 1.243, "long_mscale": 1.118,
        "original_max_position_embeddings": 8, **extra}), None) for rope_type, extra in (
        ("linear", {"rope_type": "linear", "factor": 4.0}),
        ("longrope", {"rope_type": "longrope", "short_factor": [1.0 + i / 8 for i in range(8)],
                      "long_factor": [4.0 + i for i in range(8)]}))},
}


# calls of fastpe per forward pass where it is not one per layer: Gemma 3n and 4, GPT-J
# and CodeGen rotate q and k in calls of their own, Gemma 3n's 2 last layers reuse earlier layers' keys, and
# SmolLM3's and Cohere 2's NoPE layers rotate nothing
ROTATIONS_PER_PASS = {"gemma3n": 4 + 2, "gemma4": 2 * 2, "smollm3": 1, "cohere2": 1,
                      "gptj": 2 * 2, "codegen": 2 * 2}


def prompt(family):
    """The model's inputs: 8 text tokens, and for Qwen2-VL an image of 4 x 6 patches
    (6 tokens after the 2 x 2 merge) between its start and end tokens."""
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4]])
    if family != "qwen2_vl":
        return {"input_ids": ids}
    ids = torch.cat([ids[:, :3], torch.tensor([[152] + [IMAGE_TOKEN] * 6 + [153]]), ids[:, 3:]], 1)
    gen = torch.Generator().manual_seed(1)
    return {"input_ids": ids, "pixel_values": torch.randn(24, 3 * 2 * 4 * 4, generator=gen),
            "image_grid_thw": torch.tensor([[1, 4, 6]]),
            "mm_token_type_ids": (ids == IMAGE_TOKEN).int()}


def run(model, inputs):
    """The logits of the prompt, and greedy decoding of 8 tokens: the tokens, each
    step's logits after them."""
    with torch.no_grad():
        logits = model(**inputs).logits
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False, pad_token_id=0,
                             output_logits=True, return_dict_in_generate=True)
    return torch.cat([logits] + [step[:, None] for step in out.logits], 1), out.sequences


def instance_attributes(model):
    return {name: sorted(vars(m)) for name, m in model.named_modules()}


def assert_refused_unchanged(model, match):
    """patch(model) raises a ValueError matching `match`, every module's instance
    attributes left as they were."""
    before = instance_attributes(model)
    with pytest.raises(ValueError, match=match):
        fastpe.hf.patch(model)
    assert instance_attributes(model) == before


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    return request.param


def count_rotations(monkeypatch):
    """Every call of a fastpe RotaryEmbedding from now on, as the shape of its q."""
    calls = []
    call = fastpe.RotaryEmbedding.__call__

    def counted(self, q, *args, **kwargs):
        calls.append(tuple(q.shape))
        return call(self, q, *args, **kwargs)

    monkeypatch.setattr(fastpe.RotaryEmbedding, "__call__", counted)
    return calls


def test_patched_model_gives_the_stock_tokens_and_unpatch_restores_it(family, monkeypatch):
    model = FAMILIES[family][0]()
    inputs = prompt(family)
    stock_logits, stock_tokens = run(model, inputs)
    before = instance_attributes(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    assert fastpe.hf.patch(model) is model
    calls = count_rotations(monkeypatch)
    logits, tokens = run(model, inputs)
    torch.testing.assert_close(logits, stock_logits, rtol=0, atol=2e-5)  # float32 rounding
    assert torch.equal(tokens, stock_tokens)
    # fastpe rotated q and k in every layer of 9 passes (the logits', generate's prefill
    # and its 7 decode steps), and in Qwen2-VL's 2 vision layers in the 2 with the image
    assert len(calls) == ROTATIONS_PER_PASS.get(family, SMALL["num_hidden_layers"]) * 9 + (
        2 * 2 if family == "qwen2_vl" else 0)
    calls.clear()

    assert fastpe.hf.unpatch(model) is model
    assert instance_attributes(model) == before
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    logits, tokens = run(model, inputs)
    assert torch.equal(logits, stock_logits) and torch.equal(tokens, stock_tokens)
    assert not calls


@pytest.mark.parametrize("name", ["llama", "gemma3", "qwen2_vl", "gptj", "codegen",
                                  "deepseek_v2", "llama4"])
def test_left_padded_batch(name):
    """Two prompts, the shorter left-padded: generate's (batch, seq) position_ids from
    the attention mask, each sequence at positions of its own (Qwen2-VL: (3, batch,
    seq), its image in the first)."""
    model = FAMILIES[name][0]()
    inputs = prompt(name)
    ids = inputs["input_ids"]
    pad = 3
    shorter = torch.cat([torch.zeros(1, pad, dtype=ids.dtype), ids[:, pad:].flip(1)], 1)
    if name == "qwen2_vl":  # the second prompt: text only
        shorter = torch.where(ids[:, pad:].flip(1) >= IMAGE_TOKEN, 8, ids[:, pad:].flip(1))
        shorter = torch.cat([torch.zeros(1, pad, dtype=ids.dtype), shorter], 1)
    mask = torch.ones(2, ids.shape[1], dtype=torch.long)
    mask[1, :pad] = 0
    batch = {**inputs, "input_ids": torch.cat([ids, shorter]), "attention_mask": mask}
    if name == "qwen2_vl":
        batch["mm_token_type_ids"] = (batch["input_ids"] == IMAGE_TOKEN).int()
    stock_logits, stock_tokens = run(model, batch)
    logits, tokens = run(fastpe.hf.patch(model), batch)
    torch.testing.assert_close(logits, stock_logits, rtol=0, atol=2e-5)
    assert torch.equal(tokens, stock_tokens)


def reference_rotation(x, positions, base, rotated, sections):
    """x (seq, heads, dim) rotated in float64 by the formula; positions (axes, seq)."""
    x = x.astype(np.float64).copy()
    half = rotated // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2 / rotated)
    axis = np.zeros(half, int) if sections is None else np.repeat(np.arange(3), sections)
    angle = positions[axis].T.astype(np.float64) * inv_freq             # (seq, half)
    cos, sin = np.cos(angle)[:, None], np.sin(angle)[:, None]
    a, b = x[..., :half].copy(), x[..., half:rotated].copy()
    x[..., :half], x[..., half:rotated] = a * cos - b * sin, b * cos + a * sin
    return x


def language_model(model):
    return getattr(model.model, "language_model", model.model)


def capture_q_k(model):
    """Hooks on layer 0's projections: each keeps its output (which the rotation then
    writes in place) and a copy as projected. Returns a function giving [(rotated,
    projected)] for q and k as (seq, heads, dim) arrays, and the hooks' handles."""
    attn = language_model(model).layers[0].self_attn
    fused = hasattr(attn, "qkv_proj")  # Phi-3: one projection, [q | k | v]
    projections = [attn.qkv_proj] if fused else [attn.q_proj, attn.k_proj]
    seen = {}

    def keep(module, args, out):
        seen[module] = (out, out.clone())

    handles = [p.register_forward_hook(keep) for p in projections]
    q_end = SMALL["num_attention_heads"] * HEAD_DIM
    k_end = q_end + SMALL["num_key_value_heads"] * HEAD_DIM

    def result():
        outs = [seen[p] for p in projections]
        if fused:
            outs = [tuple(t[..., cols] for t in outs[0])
                    for cols in (slice(0, q_end), slice(q_end, k_end))]
        return [tuple(t[0].reshape(t.shape[1], -1, HEAD_DIM).float().numpy() for t in pair)
                for pair in outs]

    return result, handles


@pytest.mark.parametrize("name", ["llama", "qwen2", "gemma2", "phi3", "qwen2_vl"])
def test_rotations_exact_at_2_20_positions(name):
    build, (base, rotated, sections) = FAMILIES[name]
    model = fastpe.hf.patch(build())
    result, handles = capture_q_k(model)
    seq = 8
    start = 2 ** 20
    positions = start + np.arange(seq)
    if sections is None:
        position_ids = torch.from_numpy(positions)[None]
        axes = positions[None]
    else:  # M-RoPE: each axis at its own position
        axes = np.stack([positions, positions + 3, positions + 7])
        position_ids = torch.from_numpy(axes)[:, None]
    with torch.no_grad():
        model(input_ids=torch.arange(1, seq + 1)[None], position_ids=position_ids)
    for rotated_x, projected in result():
        want = reference_rotation(projected, axes, base, rotated, sections)
        # q and k are below 1: float32 rounding (about 3e-8 here), the angles exact
        np.testing.assert_allclose(rotated_x, want, rtol=0, atol=2e-7)
    # the stock float32 angles are off by up to ~6e-2 rad here: q, k off by 2e-3 to 5e-3
    for handle in handles:
        handle.remove()
    fastpe.hf.unpatch(model)
    stock_error = max(float(np.abs(reference_rotation(p, axes, base, rotated, sections)
                                   - stock_rotate(model, p, position_ids)).max())
                      for _, p in result())
    assert stock_error > 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name, starts", [
    ("llama", [2000]), ("llama3", [2000]), ("phi3_longrope", [2000]),
    ("llama_dynamic", [2000, 0])])   # grown (a float32 buffer of its own), then reset
def test_a_model_cast_to_half_precision_rotates_by_its_rounded_frequencies(dtype, name,
                                                                            starts):
    """model.to(dtype) rounds the rotary module's inv_freq buffers, and its own code rotates
    by the rounded frequencies (at position 2000 a bfloat16 frequency is off by radians):
    the patched model rotates by them too, to the rounding of its dtype's arithmetic;
    LongRoPE's and dynamic NTK's by the buffer their own code holds for the call."""
    if dtype == torch.bfloat16:
        pytest.importorskip("ml_dtypes")   # fastpe's bfloat16 arrays (the bfloat16 extra)
    model = fastpe.hf.patch(FAMILIES[name][0]().to(dtype))
    result, handles = capture_q_k(model)
    with torch.no_grad():
        for start in starts:
            position_ids = torch.arange(start, start + 8)[None]
            model(input_ids=torch.arange(1, 9)[None], position_ids=position_ids)
    for handle in handles:
        handle.remove()
    fastpe.hf.unpatch(model)   # its module holds the state the last call left
    for rotated, projected in result():
        # the stock rotation, by the module's own (rounded) frequencies, in float32
        want = stock_rotate(model, projected, position_ids)
        # fastpe's result rounded once to the model's dtype
        ulp = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
        np.testing.assert_allclose(rotated, want, rtol=0,
                                   atol=ulp * float(np.abs(projected).max()))


@pytest.mark.parametrize("patched_in", ["float32", "bfloat16"])
def test_a_model_cast_to_bfloat16_and_back_rotates_by_its_rounded_frequencies(patched_in):
    """Cast to bfloat16 and back, a module's float32 buffers hold the rounded frequencies
    and its own code rotates by them: so does the patched model, patched before the casts
    or between them."""
    model = FAMILIES["llama3"][0]()
    if patched_in == "float32":
        model = fastpe.hf.patch(model).to(torch.bfloat16).float()
    else:
        model = fastpe.hf.patch(model.to(torch.bfloat16)).float()
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    result, handles = capture_q_k(model)
    position_ids = torch.arange(2000, 2008)[None]
    with torch.no_grad():
        model(input_ids=torch.arange(1, 9)[None], position_ids=position_ids)
    for handle in handles:
        handle.remove()
    fastpe.hf.unpatch(model)
    for rotated, projected in result():
        np.testing.assert_allclose(rotated, stock_rotate(model, projected, position_ids),
                                   rtol=0, atol=1e-6)


def test_dynamic_ntk_on_several_position_axes_is_refused_at_patch():
    """Qwen3.5's text M-RoPE module with dynamic NTK: refused by patch(), which leaves the
    model stock, not at its first forward."""
    model = text_model("qwen3_5_text", head_dim=HEAD_DIM, max_position_embeddings=10,
                       layer_types=["linear_attention", "full_attention"],
                       linear_key_head_dim=16, linear_value_head_dim=16,
                       rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                        "factor": 3.0})
    with pytest.raises(ValueError, match=r"dynamic NTK frequencies on more than one position"):
        fastpe.hf.patch(model)
    assert "forward" not in vars(model.model.rotary_emb)


def test_a_multi_axis_model_cast_to_half_precision_is_refused():
    """M-RoPE rotates each pair by its axis's position, which fastpe.hf does not give a
    module's own rounded frequencies: a model cast to bfloat16 is refused, unchanged."""
    model = FAMILIES["qwen2_vl"][0]().to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"holds frequencies other than its config's, .*"
                                         r"rounded to half precision .* several position "
                                         r"axes"):
        fastpe.hf.patch(model)
    assert not any("forward" in vars(m) for m in model.modules()
                   if type(m).__name__.endswith("RotaryEmbedding"))


def stock_rotate(model, x, position_ids):
    """x (seq, heads, dim) rotated by the model's own rotary module and apply function."""
    text = language_model(model)
    module = __import__(type(text).__module__, fromlist=["apply_rotary_pos_emb"])
    t = torch.from_numpy(x).transpose(0, 1)[None]
    with torch.no_grad():
        cos, sin = text.rotary_emb(t, position_ids)
        out, _ = module.apply_rotary_pos_emb(t, t.clone(), cos, sin)
    return out[0].transpose(0, 1).numpy()


def test_one_model_patched_another_not():
    from transformers.models.llama import modeling_llama

    apply_before = modeling_llama.apply_rotary_pos_emb
    forward_before = modeling_llama.LlamaAttention.forward
    patched = text_model("llama")
    stock = copy.deepcopy(patched)
    inputs = prompt("llama")
    want_logits, want_tokens = run(stock, inputs)
    fastpe.hf.patch(patched)
    logits, tokens = run(patched, inputs)
    stock_logits, stock_tokens = run(stock, inputs)
    assert torch.equal(tokens, want_tokens)
    assert torch.equal(stock_logits, want_logits) and torch.equal(stock_tokens, want_tokens)
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=2e-5)
    assert not torch.equal(logits, want_logits)
    assert modeling_llama.apply_rotary_pos_emb is apply_before
    assert modeling_llama.LlamaAttention.forward is forward_before
    assert not any("forward" in vars(m) for m in stock.modules())
    assert fastpe.hf.patch(patched) is patched  # again: nothing more changes
    assert sum("forward" in vars(m) for m in patched.modules()) == 1 + SMALL["num_hidden_layers"]
    fastpe.hf.unpatch(patched)
    assert fastpe.hf.unpatch(patched) is patched
    assert not any("forward" in vars(m) for m in patched.modules())


def test_models_fastpe_cannot_reproduce_raise_and_stay_unchanged():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match="no transformers rotary embedding module"):
        fastpe.hf.patch(gpt2)
    # RoPE on real coordinates, inside the model's attention code: the way to it named
    dinov3 = transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(
        hidden_size=32, num_attention_heads=2, intermediate_size=64, num_hidden_layers=1,
        image_size=32, patch_size=16))
    with pytest.raises(ValueError, match=r"model type 'dinov3_vit' is not reproduced: its "
                                         r"attention code rotates q and k by real-valued "
                                         r"coordinates.*from_hf_config"):
        fastpe.hf.patch(dinov3)
    assert not any("forward" in vars(m) for m in dinov3.modules())
    # GPT-J's form (x, sin, cos) whose function rotates otherwise than GPT-J's (halves)
    gptj = transformers.GPTJForCausalLM(transformers.GPTJConfig(
        n_embd=32, n_layer=1, n_head=2, rotary_dim=8, n_positions=64, vocab_size=64))
    gptj_module = __import__(type(gptj).__module__, fromlist=["_"])
    halves = transformers.models.llama.modeling_llama.rotate_half

    def rotate_halves(tensor, sin, cos):
        return tensor * torch.cat([cos, cos], -1)[:, :, None] + halves(tensor) * torch.cat(
            [sin, sin], -1)[:, :, None]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gptj_module, "apply_rotary_pos_emb", rotate_halves)
        with pytest.raises(ValueError, match=r"apply_rotary_pos_emb\(tensor, sin, cos\) of "
                                             r"test_hf does not rotate as GPT-J's does"):
            fastpe.hf.patch(gptj)
    # (q, k, freqs_cis) whose function turns halves, not adjacent pairs
    deepseek_v2 = FAMILIES["deepseek_v2"][0]()
    v2_module = __import__(type(deepseek_v2).__module__, fromlist=["_"])

    def by_halves(xq, xk, freqs_cis):
        cos, sin = freqs_cis.real.repeat(1, 1, 2)[:, None], freqs_cis.imag.repeat(1, 1, 2)[:, None]
        return tuple(x * cos + halves(x) * sin for x in (xq, xk))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(v2_module, "apply_rotary_emb", by_halves)
        with pytest.raises(ValueError, match=r"apply_rotary_emb\(xq, xk, freqs_cis\) of test_hf "
                                             r"does not turn adjacent pairs"):
            fastpe.hf.patch(deepseek_v2)
    # a position table edited in place: its own forward no longer gives the config's
    gptj_table = transformers.GPTJForCausalLM(transformers.GPTJConfig(
        n_embd=32, n_layer=1, n_head=2, rotary_dim=8, n_positions=64, vocab_size=64))
    with torch.no_grad():
        gptj_table.transformer.rotary_emb.embed_positions[-1] *= 1.001
    with pytest.raises(ValueError, match=r"GPTJRotaryEmbedding .* gives \(sin, cos\) other "
                                         r"than its config's"):
        fastpe.hf.patch(gptj_table)
    deepseek_v4 = text_model("deepseek_v4")
    with pytest.raises(ValueError, match="'deepseek_v4' is not reproduced: its attention also"):
        fastpe.hf.patch(deepseek_v4)
    # Evolla's protein encoder keeps a sub-config of model_type "": refused by what it is
    evolla = transformers.EvollaForProteinText2Text(transformers.EvollaConfig(
        protein_encoder_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=64, vocab_size=50),
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, aligner_num_add_layers=1, resampler_depth=1,
        resampler_heads=2, resampler_dim_head=8, resampler_num_latents=4,
        bos_token_id=1, eos_token_id=2))
    with pytest.raises(ValueError, match=r"empty model_type.*sub-configs of composite models"):
        fastpe.hf.patch(evolla)
    assert not hasattr(evolla, "_fastpe_hf_patched")
    # LFM3 of convolution layers alone: its rotary module keeps no layer type's frequencies
    lfm3 = text_model("lfm3", layer_types=["conv", "conv"])
    with pytest.raises(ValueError, match=r"no layer type: none of the config's layer_types "
                                         r"\['conv'\] is an attention layer"):
        fastpe.hf.patch(lfm3)
    llama = text_model("llama")
    hooked = llama.model.layers[1].self_attn
    hooked.forward = hooked.forward  # as accelerate's hooks do
    with pytest.raises(ValueError, match="already replaced on this instance"):
        fastpe.hf.patch(llama)
    for model in (gpt2, gptj, gptj_table, deepseek_v2, deepseek_v4, lfm3, llama):
        assert not hasattr(model, "_fastpe_hf_patched")
    assert ["forward" in vars(m) for m in llama.modules()].count(True) == 1
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module"):
        fastpe.hf.patch(object())


def test_autograd_is_refused():
    """The rotation is in place, outside autograd: a model run with grad enabled is told to
    run under no_grad or inference_mode (not to detach q, which would drop its gradient)."""
    model = fastpe.hf.patch(text_model("llama"))
    with pytest.raises(TypeError, match=r"run it under torch\.no_grad\(\)"):
        model(**prompt("llama"))


def test_stock_code_given_fastpe_positions_says_so():
    model = fastpe.hf.patch(text_model("llama"))
    from transformers.models.llama import modeling_llama
    x = torch.zeros(1, 3, SMALL["hidden_size"])
    cos, sin = model.model.rotary_emb(x, torch.arange(3)[None])
    q = torch.zeros(1, 4, 3, HEAD_DIM)
    with pytest.raises(AttributeError, match=r"fastpe\.hf: this model's code reads 'unsqueeze'"):
        modeling_llama.apply_rotary_pos_emb(q, q, cos, sin)


def test_both_backends_rotate_the_same():
    model = fastpe.hf.patch(text_model("llama"))
    inputs = prompt("llama")
    compiled, _ = run(model, inputs)
    with fastpe.use_backend("numpy"):
        reference, _ = run(model, inputs)
    torch.testing.assert_close(compiled, reference, rtol=0, atol=1e-6)


def test_a_copy_of_a_patched_model_is_patched_on_its_own(monkeypatch):
    stock = text_model("llama")
    inputs = prompt("llama")
    want, _ = run(stock, inputs)
    original = fastpe.hf.patch(copy.deepcopy(stock))
    twin = copy.deepcopy(original)
    calls = count_rotations(monkeypatch)
    fastpe.hf.unpatch(original)
    logits, _ = run(twin, inputs)
    torch.testing.assert_close(logits, want, rtol=0, atol=2e-5)
    assert calls  # the copy's own layers, still patched, rotated through fastpe
    calls.clear()
    assert torch.equal(run(original, inputs)[0], want) and not calls
    assert torch.equal(run(fastpe.hf.unpatch(twin), inputs)[0], want)


def test_copies_of_a_patched_model_used_in_turn_keep_their_own_verdicts(monkeypatch):
    """A deepcopy shares the patched forward (functions are not copied): whether a module
    holds its frequencies rounded is still decided once per module, not at every call
    that follows the other copy's."""
    original = fastpe.hf.patch(text_model("llama").half())
    twin = copy.deepcopy(original)
    decided = []
    is_rounded = fastpe.hf._is_rounded
    monkeypatch.setattr(fastpe.hf, "_is_rounded",
                        lambda buffer, rope: decided.append(buffer) or is_rounded(buffer, rope))
    inputs = prompt("llama")
    outs = []
    with torch.no_grad():
        for _ in range(3):
            for model in (original, twin):
                outs.append(model(**inputs).logits)
    assert len(decided) == 2 and decided[0] is not decided[1]
    assert all(torch.equal(out, outs[0]) for out in outs)


def deberta(**settings):
    config = transformers.DebertaV2Config(
        **{**dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, vocab_size=100, max_position_embeddings=128,
                  relative_attention=True, position_biased_input=False, initializer_range=0.3,
                  norm_rel_ebd="layer_norm"), **settings})
    torch.manual_seed(0)
    return transformers.DebertaV2ForMaskedLM(config).eval()


def test_a_subclass_defined_outside_transformers_is_refused_by_name():
    """fastpe.hf knows transformers' own classes: a user's subclass of one is named in the
    error, and the model stays as it was."""
    deberta_module = transformers.models.deberta_v2.modeling_deberta_v2
    llama_module = transformers.models.llama.modeling_llama

    class MyAttention(deberta_module.DisentangledSelfAttention):
        pass

    class MyRotary(llama_module.LlamaRotaryEmbedding):
        pass

    encoder = deberta(pos_att_type=["c2p", "p2c"], position_buckets=32,
                      max_relative_positions=64)
    for layer in encoder.deberta.encoder.layer:
        mine = MyAttention(encoder.config)
        mine.load_state_dict(layer.attention.self.state_dict())
        layer.attention.self = mine
    llama = text_model("llama")
    llama.model.rotary_emb = MyRotary(llama.config)
    for model, name, cls, base in (
            (encoder, "deberta.encoder.layer.0.attention.self", "MyAttention",
             "DisentangledSelfAttention"),
            (llama, "model.rotary_emb", "MyRotary", "LlamaRotaryEmbedding")):
        assert_refused_unchanged(model, rf"'{name}' is a .*{cls} \(test_hf\), a subclass "
                                        rf"of transformers' {base} defined outside")


@pytest.mark.parametrize("layers", ["every", "one"])
def test_an_attention_subclass_whose_forward_hides_the_apply_call_is_named(layers):
    """An attention class of the user's whose forward calls its transformers base's (which
    calls the apply function) gives fastpe.hf no call to replace: the refusal names it,
    also where the other layers are transformers' own (whose calls fastpe.hf would
    replace, while that layer's stock call got what the patched rotary module returns)."""
    llama_module = transformers.models.llama.modeling_llama

    class MyAttention(llama_module.LlamaAttention):
        def forward(self, hidden_states, position_embeddings, *args, **kwargs):
            return super().forward(hidden_states, position_embeddings, *args, **kwargs)

    llama = text_model("llama")
    for layer in llama.model.layers[-1:] if layers == "one" else llama.model.layers:
        mine = MyAttention(llama.config, layer.self_attn.layer_idx)
        mine.load_state_dict(layer.self_attn.state_dict())
        layer.self_attn = mine
    first = len(llama.model.layers) - 1 if layers == "one" else 0
    assert_refused_unchanged(llama, rf"'model\.layers\.{first}\.self_attn' is a MyAttention "
                                    r"\(test_hf\), a class defined outside transformers "
                                    r"whose forward replaces that of transformers' "
                                    r"LlamaAttention")


def apply_rotary_pairs(q, k, cos, sin, unsqueeze_dim=1):
    """An apply function of a user's model (named as transformers names them) that turns
    adjacent pairs by transformers' rotate_half cos and sin."""
    half = q.shape[-1] // 2
    cos = cos.unsqueeze(unsqueeze_dim)[..., :half].repeat_interleave(2, -1)
    sin = sin.unsqueeze(unsqueeze_dim)[..., :half].repeat_interleave(2, -1)

    def turned(x):
        return torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)
    return q * cos + turned(q) * sin, k * cos + turned(k) * sin


def test_an_attention_class_calling_an_apply_function_of_its_own_is_refused():
    """An attention class of the user's whose forward calls an apply function by the
    name transformers' use, but its own (here turning adjacent pairs, where the config
    says halves): fastpe.hf cannot tell its form, so it refuses the model unchanged."""
    llama_module = transformers.models.llama.modeling_llama

    class PairsAttention(llama_module.LlamaAttention):
        def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
            shape = (*hidden_states.shape[:-1], -1, self.head_dim)
            q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
            k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
            v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
            q, k = apply_rotary_pairs(q, k, *position_embeddings)
            out, weights = llama_module.eager_attention_forward(
                self, q, k, v, attention_mask, scaling=self.scaling, dropout=0.0, **kwargs)
            return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1)), weights

    llama = text_model("llama")
    for layer in llama.model.layers:
        mine = PairsAttention(llama.config, layer.self_attn.layer_idx)
        mine.load_state_dict(layer.self_attn.state_dict())
        layer.self_attn = mine
    assert_refused_unchanged(llama, r"'model\.layers\.0\.self_attn' is a PairsAttention "
                                    r"\(test_hf\), a class defined outside transformers "
                                    r"whose forward calls apply_rotary_pairs itself")


def count_disentangled(monkeypatch):
    """Every disentangled bias fastpe adds from now on, as the shape of the scores."""
    calls = []
    add = fastpe.relative.add_disentangled_bias

    def counted(scores, **kwargs):
        calls.append(tuple(scores.shape))
        return add(scores, **kwargs)

    monkeypatch.setattr(fastpe.relative, "add_disentangled_bias", counted)
    return calls


@pytest.mark.parametrize("settings", [
    # DeBERTa-v3's: log buckets, keys and queries projected by the content projections
    dict(position_buckets=32, max_relative_positions=64, share_att_key=True,
         pos_att_type=["p2c", "c2p"]),
    # DeBERTa-v2's xlarge style: own position projections, one term or the other
    dict(position_buckets=-1, max_relative_positions=-1, share_att_key=False,
         pos_att_type=["c2p"]),
    dict(position_buckets=16, max_relative_positions=-1, share_att_key=False,
         pos_att_type=["p2c"]),
    dict(position_buckets=-1, max_relative_positions=24, share_att_key=True,
         pos_att_type=["c2p", "p2c"])], ids=["v3", "c2p", "p2c", "unbucketed"])
def test_deberta_disentangled_attention_is_the_stock_models_bit_for_bit(settings, monkeypatch):
    """DeBERTa-v2/v3's relative attention added by fastpe, in place into the scores: the
    same float32 logits as stock (padded batch, sequences past the bucketed distances),
    one fastpe pass per layer, and unpatch gives the stock model back."""
    model = deberta(**settings)
    ids = torch.randint(1, 100, (2, 100), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 100, dtype=torch.long)
    mask[1, 70:] = 0
    with torch.no_grad():
        stock = model(ids, attention_mask=mask).logits
        fastpe.hf.patch(model)
        calls = count_disentangled(monkeypatch)
        assert torch.equal(model(ids, attention_mask=mask).logits, stock)
        assert calls == [(2 * 4, 100, 100)] * 2
        calls.clear()
        # a forward wrapped after patch (accelerate's hooks): unpatch removes only its own
        attention = model.deberta.encoder.layer[0].attention.self
        attention.forward = attention.forward
        assert torch.equal(fastpe.hf.unpatch(model)(ids, attention_mask=mask).logits, stock)
        assert "forward" in vars(attention)
        assert "disentangled_attention_bias" not in vars(attention)
    assert not calls


@pytest.mark.parametrize("settings", [
    dict(max_relative_positions=-1, pos_att_type=["c2p", "p2c"]),
    # a span clipped below the sequence, talking heads after the bias
    dict(max_relative_positions=16, pos_att_type=["c2p", "p2c"], talking_head=True),
    dict(max_relative_positions=64, pos_att_type=["p2c"])], ids=["base", "clipped", "p2c"])
def test_deberta_v1_disentangled_attention_is_the_stock_models_bit_for_bit(settings,
                                                                          monkeypatch):
    """DeBERTa (v1): a span of min(max(q, k), max_relative_positions), the middle rows
    of its relative embeddings, no buckets, c2p from the already divided query."""
    config = transformers.DebertaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        vocab_size=100, max_position_embeddings=128, relative_attention=True,
        position_biased_input=False, initializer_range=0.3, **settings)
    torch.manual_seed(0)
    model = transformers.DebertaForMaskedLM(config).eval()
    ids = torch.randint(1, 100, (2, 40), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[0, 30:] = 0
    with torch.no_grad():
        stock = model(ids, attention_mask=mask).logits
        fastpe.hf.patch(model)
        calls = count_disentangled(monkeypatch)
        assert torch.equal(model(ids, attention_mask=mask).logits, stock)
        assert calls == [(2, 4, 40, 40)] * 2
        assert torch.equal(fastpe.hf.unpatch(model)(ids, attention_mask=mask).logits, stock)
        # no c2p or p2c term left (edited after patch): the stock method, as stock runs
        fastpe.hf.patch(model)
        for layer in model.deberta.encoder.layer:
            layer.attention.self.pos_att_type = ["p2p"]
        calls.clear()
        model(ids, attention_mask=mask)
        assert not calls


def test_deberta_with_relative_positions_of_its_own_runs_the_stock_bias(monkeypatch):
    """Relative positions a caller passes, not those of the model's settings, take the
    stock code; settings fastpe does not reproduce are refused at patch."""
    model = deberta(position_buckets=32, max_relative_positions=64, pos_att_type=["p2c", "c2p"])
    encoder = model.deberta.encoder
    hidden = torch.randn(1, 12, 64, generator=torch.Generator().manual_seed(2))
    own = torch.arange(12)[None, :, None] - torch.arange(12)[None, None, :] * 2
    with torch.no_grad():
        stock = encoder(hidden, torch.ones(1, 12), relative_pos=own).last_hidden_state
        fastpe.hf.patch(model)
        calls = count_disentangled(monkeypatch)
        assert torch.equal(encoder(hidden, torch.ones(1, 12), relative_pos=own).last_hidden_state,
                           stock)
    assert not calls
    # log buckets need max_relative_positions - 1 > position_buckets // 2
    unusual = deberta(position_buckets=256, max_relative_positions=-1, pos_att_type=["c2p"])
    with pytest.raises(ValueError, match=r"disentangled attention 'deberta\.encoder\.layer\.0\."
                                         r"attention\.self' .* settings fastpe does not reproduce"):
        fastpe.hf.patch(unusual)
    assert not hasattr(unusual, "_fastpe_hf_patched")


def test_deberta_runs_in_inference_mode_compiled_and_with_its_relative_positions_reused(
        monkeypatch):
    """inference tensors (no version counter), torch.compile (the bias and its in-place
    add run between its graphs) and the same relative positions given twice."""
    model = deberta(position_buckets=32, max_relative_positions=64, pos_att_type=["p2c", "c2p"])
    ids = torch.randint(1, 100, (1, 40), generator=torch.Generator().manual_seed(5))
    hidden = torch.randn(1, 12, 64, generator=torch.Generator().manual_seed(6))
    own = torch.from_numpy(fastpe.deberta_relative_positions(
        12, 12, position_buckets=32, max_relative_positions=64))[None]
    with torch.no_grad():
        stock = model(ids).logits
        stock_encoded = model.deberta.encoder(hidden, torch.ones(1, 12), relative_pos=own)
        fastpe.hf.patch(model)
        calls = count_disentangled(monkeypatch)
        with torch.inference_mode():
            assert torch.equal(model(ids).logits, stock)
        for _ in range(2):
            encoded = model.deberta.encoder(hidden, torch.ones(1, 12), relative_pos=own)
            assert torch.equal(encoded.last_hidden_state, stock_encoded.last_hidden_state)
        assert len(calls) == 2 * 3
        compiled = torch.compile(model, backend="eager")
        assert torch.equal(compiled(ids).logits, stock) and len(calls) == 2 * 4
        with torch.enable_grad(), pytest.raises(TypeError, match=r"torch\.no_grad\(\)"):
            model(ids)
        # only the relative embeddings trainable: the logits alone require grad
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        model.deberta.encoder.rel_embeddings.weight.requires_grad_(True)
        with torch.enable_grad(), pytest.raises(TypeError, match=r"torch\.no_grad\(\)"):
            model(ids)


def test_deberta_whose_forward_fastpe_cannot_see_is_refused_and_stays_stock(monkeypatch):
    """A forward replaced on the instance (accelerate's hooks) is not the one the probe
    runs; a class forward that keeps the scores before the bias (which fastpe adds in
    place) gives other tensors on the probe; no c2p or p2c term: nothing to patch."""
    model = deberta(position_buckets=32, max_relative_positions=64, pos_att_type=["c2p"])
    attention = model.deberta.encoder.layer[1].attention.self
    attention.forward = attention.forward
    with pytest.raises(ValueError, match=r"forward of the disentangled attention "
                                         r"'deberta\.encoder\.layer\.1\.attention\.self' .* "
                                         r"replaced on this instance"):
        fastpe.hf.patch(model)
    assert not hasattr(model, "_fastpe_hf_patched")
    assert "disentangled_attention_bias" not in vars(attention)
    # the class forward keeping the content-to-content scores before the bias is added
    cls = type(attention)
    modeling = __import__(cls.__module__, fromlist=["_"])
    source = textwrap.dedent(inspect.getsource(cls.forward))
    added = "        attention_scores = attention_scores + rel_att\n"
    assert added in source
    namespace = dict(vars(modeling))
    exec(source.replace(added, "        self.raw = attention_scores\n"
                                "        attention_scores = self.raw + rel_att\n"), namespace)
    monkeypatch.setattr(cls, "forward", namespace["forward"])
    keeping = deberta(position_buckets=32, max_relative_positions=64, pos_att_type=["c2p"])
    with pytest.raises(ValueError, match=r"gives other numbers with fastpe's bias"):
        fastpe.hf.patch(keeping)
    assert not hasattr(keeping, "_fastpe_hf_patched")
    monkeypatch.undo()
    none = deberta(position_buckets=32, max_relative_positions=64, pos_att_type=[])
    with pytest.raises(ValueError, match=r"nor DeBERTa's disentangled attention"):
        fastpe.hf.patch(none)


def deberta_pair(**settings):
    """A DeBERTa-v2 masked LM and its patched copy (the same weights), and token ids."""
    model = deberta(**settings)
    ids = torch.randint(1, 100, (2, 40), generator=torch.Generator().manual_seed(0))
    return model, fastpe.hf.patch(copy.deepcopy(model)), ids


def test_deberta_bias_method_replaced_on_the_class_after_patch_runs_as_in_stock(monkeypatch):
    """A bias method replaced on transformers' class after patch (a fix applied at run
    time) is what the stock model runs: the patched one runs it too."""
    v1 = transformers.models.deberta.modeling_deberta
    v2 = transformers.models.deberta_v2.modeling_deberta_v2
    torch.manual_seed(0)
    first = transformers.DebertaForMaskedLM(transformers.DebertaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        vocab_size=100, relative_attention=True, max_relative_positions=64,
        pos_att_type=["c2p", "p2c"])).eval()
    ids = torch.randint(1, 100, (2, 40), generator=torch.Generator().manual_seed(0))
    second, second_patched, _ = deberta_pair(position_buckets=32, max_relative_positions=64,
                                             pos_att_type=["c2p", "p2c"])
    for stock, patched, cls, name in [
            (first, fastpe.hf.patch(copy.deepcopy(first)), v1.DisentangledSelfAttention,
             "disentangled_att_bias"),
            (second, second_patched, v2.DisentangledSelfAttention,
             "disentangled_attention_bias")]:
        with torch.no_grad():
            before = stock(ids).logits
            original = getattr(cls, name)
            monkeypatch.setattr(cls, name, lambda self, *args, f=original: f(self, *args) * 0.5)
            want = stock(ids).logits
            assert not torch.equal(want, before)
            assert torch.equal(patched(ids).logits, want)
        monkeypatch.undo()


@pytest.mark.parametrize("name, value", [
    ("pos_ebd_size", 16), ("max_relative_positions", 2), ("max_relative_positions", 64.0),
    ("position_buckets", 32.0)])
def test_deberta_settings_edited_after_patch_run_as_in_stock(name, value):
    """A span, or settings of a layer, edited after patch to what fastpe's add does not
    take (another span, a float equal to the int): the stock code runs them
    (max_relative_positions of a layer is not what its relative positions were made
    with: the encoder's are)."""
    stock, patched, ids = deberta_pair(position_buckets=32, max_relative_positions=64,
                                       pos_att_type=["c2p", "p2c"])
    with torch.no_grad():
        patched(ids)   # the relative positions of these lengths made (and kept) first
    for model in (stock, patched):
        for layer in model.deberta.encoder.layer:
            setattr(layer.attention.self, name, value)
    with torch.no_grad():
        assert torch.equal(patched(ids).logits, stock(ids).logits)


def test_dynamically_quantized_deberta_is_patched_bit_for_bit():
    """Its linear layers hold packed weights, no parameters: the probe decides."""
    quantize = getattr(getattr(torch, "ao", None), "quantization", None)
    if getattr(quantize, "quantize_dynamic", None) is None:
        pytest.skip("this torch has no torch.ao.quantization.quantize_dynamic")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch.ao.quantization's deprecation
        stock = quantize.quantize_dynamic(
            deberta(position_buckets=32, max_relative_positions=64,
                    pos_att_type=["c2p", "p2c"]), {torch.nn.Linear}, dtype=torch.qint8)
    assert not list(stock.deberta.encoder.layer[0].attention.self.parameters())
    patched = fastpe.hf.patch(copy.deepcopy(stock))
    ids = torch.randint(1, 100, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(patched(ids).logits, stock(ids).logits)


def test_deberta_off_the_cpu_is_refused_by_its_device():
    with torch.device("meta"):
        model = deberta(position_buckets=32, max_relative_positions=64, pos_att_type=["c2p"])
    with pytest.raises(ValueError, match=r"is on meta: fastpe adds the bias into CPU tensors"):
        fastpe.hf.patch(model)


def test_a_probed_adjacent_pair_function_beside_a_config_read_as_halves_is_refused(
        monkeypatch):
    """GPT-J's apply function turns adjacent pairs (the probes saw it): a rotary module
    fastpe reads as rotating halves cannot be what that model does."""
    read = fastpe.RotaryEmbedding._from_hf_module.__func__

    def as_halves(cls, *args, **kwargs):
        rope = read(cls, *args, **kwargs)
        return fastpe.RotaryEmbedding(rope.head_dim, rotary_dim=rope.rotary_dim, style="neox")

    monkeypatch.setattr(fastpe.RotaryEmbedding, "_from_hf_module", classmethod(as_halves))
    model = FAMILIES["gptj"][0]()
    with pytest.raises(ValueError, match=r"read from its config as rotating halves of each "
                                         r"head, but apply_rotary_pos_emb, run on probes, "
                                         r"turns adjacent pairs"):
        fastpe.hf.patch(model)


def test_sew_d_disentangled_attention_is_the_stock_models_bit_for_bit(monkeypatch):
    config = transformers.SEWDConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, squeeze_factor=2, max_position_embeddings=64,
        position_buckets=16, initializer_range=0.3)
    torch.manual_seed(0)
    model = transformers.SEWDModel(config).eval()
    audio = torch.randn(2, 4000, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        stock = model(audio).last_hidden_state
        fastpe.hf.patch(model)
        calls = count_disentangled(monkeypatch)
        assert torch.equal(model(audio).last_hidden_state, stock)
    assert calls == [(2 * 4, 199, 199)] * 2   # the squeezed sequence's


def test_inference_mode_and_float16():
    model = text_model("llama")
    half = copy.deepcopy(model).half()
    ids = prompt("llama")["input_ids"]
    with torch.no_grad():
        want, want16 = model(ids).logits, half(ids).logits
    with torch.inference_mode():
        got = fastpe.hf.patch(model)(ids).logits
        got16 = fastpe.hf.patch(half)(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    torch.testing.assert_close(got16, want16, rtol=0, atol=2e-3)  # float16's ulp at 1: 1e-3


def test_float16_frequencies_held_as_subnormals_are_float16_rounding():
    """A large base (Llama 3's 500000) puts inv_freq below float16's normal range, where
    model.half() rounds to steps of 2**-24: not a frequency edited after the build."""
    model = text_model("llama", head_dim=32, num_attention_heads=2,
                       rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    half = model.half()
    assert half.model.rotary_emb.inv_freq.min() < 2.0**-14
    ids = prompt("llama")["input_ids"]
    with torch.no_grad():
        want = half(ids).logits
        got = fastpe.hf.patch(half)(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=4e-3)


@pytest.mark.parametrize("model_type", ["beam", "ergo"])
def test_layer_types_without_rope_parameters_are_nope_layers(model_type):
    """Beam's and Ergo's full-attention layers have rope parameters None: their rotary
    module makes no frequencies for them and those layers rotate nothing."""
    model = text_model(model_type, head_dim=HEAD_DIM,
                       layer_types=["sliding_attention", "full_attention"])
    assert model.config.rope_parameters["full_attention"] is None
    inputs = prompt("llama")
    stock_logits, stock_tokens = run(model, inputs)
    fastpe.hf.patch(model)
    logits, tokens = run(model, inputs)
    torch.testing.assert_close(logits, stock_logits, rtol=0, atol=2e-5)
    assert torch.equal(tokens, stock_tokens)


@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 10000.0},
                                  {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}],
                         ids=["default", "dynamic"])
def test_a_query_rotated_by_the_keys_last_positions(rope):
    """MuseGlimmer's drafter: its keys hold the main model's context before its own
    block, and its apply function rotates the shorter query by the keys' last
    positions; with dynamic NTK, by the frequencies of the longest call so far."""
    config = transformers.MuseGlimmerAssistantConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=HEAD_DIM, block_size=4, target_layer_ids=[0, 1],
        max_position_embeddings=32, sliding_window=64, rope_parameters=rope)
    torch.manual_seed(0)
    stock = transformers.MuseGlimmerAssistantModel(config).eval()
    patched = fastpe.hf.patch(copy.deepcopy(stock))
    g = torch.Generator().manual_seed(1)
    for context in (100, 40, 6):          # keys of 104, 44 and 10 positions
        noise = torch.randn(1, 4, 64, generator=g)
        hidden = torch.randn(1, context, 128, generator=g)
        with torch.no_grad():
            want = stock(noise_embeds=noise, context_hidden_states=hidden).last_hidden_state
            got = patched(noise_embeds=noise, context_hidden_states=hidden).last_hidden_state
        torch.testing.assert_close(got, want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("bad_k, match", [
    (lambda: torch.randn(1, 2, 12, 18), r"^k has head_dim 18"),
    (lambda: torch.randn(1, 2, 11, 16), r"^positions must have shape \(11,\)"),
    (lambda: torch._neg_view(torch.randn(1, 2, 12, 16)), r"^k is a torch view with its negative"),
    ("inference", r"^k is an inference tensor"),
    ("holds q", r"^q overlaps k"),
    ("q expanded", r"^q has overlapping elements"),
], ids=["head_dim", "tokens", "negated", "inference", "overlap", "q-expanded"])
def test_a_query_rotated_by_the_keys_last_positions_is_left_as_it_was_when_k_is_refused(
        bad_k, match):
    """The stand-in of such an apply function rotates q and k in two calls: a k refused
    by the second, or one a single call would refuse beside q, leaves q unwritten, and
    the message names k."""
    from transformers.models.muse_glimmer_assistant import modeling_muse_glimmer_assistant
    stand_in = fastpe.hf._apply_function(
        "apply_rotary_pos_emb", modeling_muse_glimmer_assistant.apply_rotary_pos_emb)
    cs = fastpe.hf._Positions(fastpe.RotaryEmbedding(16), None, torch.arange(12)[None])
    q = torch.randn(1, 2, 4, 16)
    if bad_k == "inference":
        with torch.inference_mode():
            k = torch.randn(1, 2, 12, 16)
    elif bad_k == "holds q":
        k = torch.randn(1, 2, 12, 16)
        q = k[:, :, -4:]
    elif bad_k == "q expanded":     # refused only when written: after k, in a copy's place
        k = torch.randn(1, 2, 12, 16)
        q = torch.randn(1, 1, 4, 16).expand(1, 2, 4, 16)
    else:
        k = bad_k()
    before, k_before = q.clone(), k.clone()
    with torch.no_grad(), pytest.raises((TypeError, ValueError), match=match):
        stand_in(q, k, cs, cs)
    assert torch.equal(q, before) and q._version == 0
    assert torch.equal(k, k_before)


def test_an_apply_function_wrapped_by_the_kernel_hub_is_read_as_its_function():
    """transformers 5.25 and later (with `kernels`) hold each modeling file's apply
    function as an nn.Module instance whose forward(*args, **kwargs) calls it: fastpe.hf
    reads the function it closes over (the transformers installed here may or may not
    wrap; this builds the wrapper's shape itself)."""
    import inspect

    from fastpe.hf import _hub_function

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        return q, k

    def make(func):
        class Func(torch.nn.Module):
            kernel_layer_name = "rotary_pos_emb"

            def forward(self, *args, **kwargs):
                return func(*args, **kwargs)

        return Func()

    wrapped = make(apply_rotary_pos_emb)
    assert _hub_function(wrapped) is apply_rotary_pos_emb
    assert _hub_function(apply_rotary_pos_emb) is apply_rotary_pos_emb
    plain = torch.nn.Identity()   # a module that is no hub wrapper is left as it is
    assert _hub_function(plain) is plain
    from transformers.models.llama import modeling_llama

    found = _hub_function(modeling_llama.apply_rotary_pos_emb)
    assert list(inspect.signature(found).parameters)[:4] == ["q", "k", "cos", "sin"]


def test_a_model_type_of_a_newer_transformers_is_refused(monkeypatch):
    """A model type that the transformers this process imported knows, but fastpe's tables
    (one transformers release) do not, is refused, not read as Llama's; a model type
    that transformers does not know at all (a custom model) still loads as Llama's.
    The installed transformers may be the checked release itself: the test takes one of
    its model types out of fastpe's table of known types."""
    from fastpe import _hf_models

    monkeypatch.setattr(_hf_models, "KNOWN", _hf_models.KNOWN - {"llama"})
    cfg = {"hidden_size": 256, "num_attention_heads": 4, "rope_theta": 10000.0,
           "max_position_embeddings": 2048}
    with pytest.raises(ValueError, match=r"model_type 'llama' is a model type of the "
                                         r"transformers .* newer than the transformers"):
        fastpe.RotaryEmbedding.from_hf_config({**cfg, "model_type": "llama"})
    rope = fastpe.RotaryEmbedding.from_hf_config({**cfg, "model_type": "not_a_transformers_type"})
    assert (rope.head_dim, rope.rotary_dim, rope.style) == (64, 64, "neox")


def test_dynamic_ntk_keeps_the_frequencies_of_the_longest_call_as_transformers_does():
    """transformers' dynamic NTK module keeps the frequencies of its longest call until a
    call shorter than the original length resets them: a 12-token call after a 40-token
    one rotates with the 40-token frequencies. The patched model keeps the same state
    (the module's own), on a copy of its own too, and unpatched runs on from it."""
    stock = text_model("llama", max_position_embeddings=8, initializer_range=0.2,
                       rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                        "factor": 2.0})
    patched = fastpe.hf.patch(copy.deepcopy(stock))
    ids = torch.randint(3, 160, (2, 40), generator=torch.Generator().manual_seed(1))
    logits = []
    with torch.no_grad():
        # growth, kept, kept at the original length, growth, reset, plain
        for n in (12, 40, 12, 8, 30, 5, 12):
            want = stock(ids[:, :n]).logits
            torch.testing.assert_close(patched(ids[:, :n]).logits, want, rtol=0, atol=2e-5)
            logits.append(want)
        # 12 tokens after the 40-token call: not what 12 tokens alone give
        assert (logits[2] - logits[0]).abs().max() > 1e-2
        assert torch.equal(logits[6], logits[0])
        stock(ids[:, :40])
        patched(ids[:, :40])
        twin = copy.deepcopy(patched)   # holds the 40-token state
        torch.testing.assert_close(twin(ids[:, :12]).logits, stock(ids[:, :12]).logits,
                                   rtol=0, atol=2e-5)
        assert torch.equal(fastpe.hf.unpatch(patched)(ids[:, :12]).logits,
                           stock(ids[:, :12]).logits)


@pytest.mark.parametrize("model_type", ["solar_open", "gpt_oss", "ministral3", "gpt_neox"])
@pytest.mark.parametrize("key, value", [("rotary_dim", 8), ("rotary_pct", 0.5), (None, None)])
def test_the_rotated_width_is_what_the_family_reads(model_type, key, value):
    """Most families size their frequencies by partial_rotary_factor alone: a rotary_dim
    or rotary_pct their code never reads changes nothing (GPT-NeoX's config reads
    rotary_pct). The truth: the model's own rotary module and logits."""
    extra = {} if key is None else {key: value}
    stock = text_model(model_type, head_dim=HEAD_DIM, initializer_range=0.2,
                       num_local_experts=4, num_experts_per_tok=2, **extra)
    rotary = next(m for m in stock.modules() if type(m).__name__.endswith("RotaryEmbedding"))
    for given in (stock.config, stock.config.to_dict()):
        rope = fastpe.RotaryEmbedding.from_hf_config(given)
        assert rope.rotary_dim == 2 * rotary.inv_freq.numel()
    patched = fastpe.hf.patch(copy.deepcopy(stock))
    ids = torch.randint(3, 160, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(patched(ids).logits, stock(ids).logits, rtol=0, atol=2e-5)


def test_jetmoe_dict_with_kv_channels_takes_them_as_its_head_dim():
    """JetMoE stores head_dim as kv_channels: a dict that gives kv_channels takes them,
    not the class default of 128 beside them."""
    given = {"model_type": "jetmoe", "hidden_size": 64, "num_attention_heads": 4,
             "kv_channels": 16}
    assert transformers.JetMoeConfig(**{k: v for k, v in given.items() if k != "model_type"}
                                     ).head_dim == 16
    assert fastpe.RotaryEmbedding.from_hf_config(given).rotary_dim == 16


@pytest.mark.parametrize("model_type, key", [("gpt_neox", "rotary_pct"),
                                             ("gpt_neox_japanese", "rotary_pct"),
                                             ("gptj", "rotary_dim"), ("codegen", "rotary_dim")])
def test_a_config_dict_without_the_width_key_takes_the_config_class_default(model_type, key):
    config = transformers.AutoConfig.for_model(model_type, hidden_size=1024,
                                               num_attention_heads=8)
    rope_parameters = getattr(config, "rope_parameters", None) or {}
    want = (int(128 * rope_parameters["partial_rotary_factor"]) if key == "rotary_pct"
            else config.rotary_dim)
    given = {"model_type": model_type, "hidden_size": 1024, "num_attention_heads": 8}
    assert fastpe.RotaryEmbedding.from_hf_config(given).rotary_dim == want
    if key == "rotary_pct":
        # the class puts rotary_pct's default in the rope parameters, whatever a
        # top-level partial_rotary_factor says
        given["partial_rotary_factor"] = 1.0
        loaded = transformers.AutoConfig.for_model(**given)
        assert loaded.rope_parameters["partial_rotary_factor"] == rope_parameters[
            "partial_rotary_factor"]
        assert fastpe.RotaryEmbedding.from_hf_config(given).rotary_dim == want


def _module_cos(model_type, config, positions, layer_type=None):
    """cos of the family's own rotary module at `positions`, as it returns them (one
    value per feature; GPT-J's one per frequency)."""
    import importlib
    name = type(config).__module__.rsplit(".", 2)[-2]
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    cls = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
    args = () if layer_type is None else (layer_type,)
    first, second = cls(config)(torch.zeros(1), torch.from_numpy(positions)[None], *args)
    return (second if model_type == "gptj" else first)[0].double().numpy()  # GPT-J: (sin, cos)


@pytest.mark.parametrize("model_type, kwargs, layer_type", [
    # GPT-J's sinusoid table: base 10000 and rotary_dim, whatever the rope dict says
    ("gptj", dict(n_embd=256, n_head=4, rotary_dim=16, partial_rotary_factor=0.5,
                  rope_parameters={"rope_type": "linear", "factor": 2.0,
                                   "rope_theta": 500000.0}), None),
    # HunYuan's "dynamic" with an alpha: a fixed base of theta * alpha^(d / (d - 2))
    ("hunyuan_v1_dense", dict(head_dim=32, rope_theta=1e4, rope_scaling={
        "alpha": 1000.0, "beta_fast": 32, "factor": 1.0, "mscale": 1.0, "type": "dynamic"}),
     None),
    # a default-type module of its own that reads no partial_rotary_factor
    ("apertus", dict(rope_parameters={"rope_type": "default", "rope_theta": 2812.0,
                                      "partial_rotary_factor": 0.5}), None),
    ("ministral3", dict(rope_parameters={"rope_type": "default", "rope_theta": 2812.0,
                                         "partial_rotary_factor": 0.5}), None),
    ("lfm3", dict(head_dim=64, rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 3.4e5,
                           "partial_rotary_factor": 0.5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 144.0,
                              "partial_rotary_factor": 0.5}}), "full_attention"),
    # a partial factor inside a layer type's entry is read (Step 3.5's per-layer
    # partial_rotary_factors land there), though a top-level one is not
    ("step3p5", dict(num_hidden_layers=2, layer_types=["full_attention"] * 2, rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 5e6,
                           "partial_rotary_factor": 0.5}}), "full_attention"),
    ("gemma4_text", dict(head_dim=32, rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4,
                              "partial_rotary_factor": 0.5},
        "full_attention": {"rope_type": "default", "rope_theta": 1e6,
                           "partial_rotary_factor": 0.5}}), "sliding_attention"),
    # MiMo-V2-Flash's default-type function: a layer type's own factor, else 0.334 of the
    # head; other types: transformers' functions, the entry's or the top-level one
    ("mimo_v2_flash", dict(head_dim=96, rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1e3},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5e2,
                              "partial_rotary_factor": 0.5}}), "full_attention"),
    ("mimo_v2_flash", dict(head_dim=96, rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1e3},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5e2,
                              "partial_rotary_factor": 0.5}}), "sliding_attention"),
    ("mimo_v2_flash", dict(head_dim=96, partial_rotary_factor=0.25, rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1e3,
                           "partial_rotary_factor": 0.5},
        "sliding_attention": {"rope_type": "llama3", "rope_theta": 5e2, "factor": 4.0,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 16}}), "sliding_attention"),
    # transformers' shared frequency functions (every rope type but the default) copy a
    # top-level factor into the layer type's entry and read it there...
    ("laguna", dict(head_dim=32, partial_rotary_factor=0.5, rope_parameters={
        "full_attention": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 4.0,
                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 16},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}), "full_attention"),
    # ...while a family's own default-type function reads the entry as it finds it: with
    # no shared function to copy it, a top-level factor is not read
    ("laguna", dict(head_dim=32, partial_rotary_factor=0.5, rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1.4e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
     "full_attention"),
    # per layer type: yarn's truncate is read from the top-level dict (so True)...
    ("ergo", dict(rope_parameters={"sliding_attention": {
        "rope_type": "yarn", "rope_theta": 880.33, "factor": 1.241, "beta_fast": 64,
        "original_max_position_embeddings": 64, "truncate": False},
        "full_attention": None}), "sliding_attention"),
    # ...and an entry's original length is its own, not the top-level one, which an
    # entry without one does not take either (max_position_embeddings)
    ("olmo3", dict(max_position_embeddings=128, original_max_position_embeddings=32,
                   num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
                   rope_parameters={
                       "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                       "full_attention": {"rope_type": "yarn", "rope_theta": 5e4,
                                          "factor": 4.0}}), "full_attention"),
    ("laguna", dict(head_dim=64, max_position_embeddings=256,
                    original_max_position_embeddings=128, rope_parameters={
                        "full_attention": {
                            "rope_type": "longrope", "rope_theta": 2670.0,
                            "original_max_position_embeddings": 256,
                            "short_factor": [1.0 + i / 32 for i in range(32)],
                            "long_factor": [2.0 + i for i in range(32)]},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
     "full_attention"),
])
def test_from_hf_config_reads_what_the_family_code_reads(model_type, kwargs, layer_type):
    base = {} if model_type == "gptj" else dict(hidden_size=128, num_attention_heads=4,
                                                num_key_value_heads=2,
                                                max_position_embeddings=64)
    # a copy: config classes fill their defaults into the nested dicts they are given
    given_keys = {"model_type": model_type, **copy.deepcopy({**base, **kwargs})}
    config = transformers.AutoConfig.for_model(model_type, **copy.deepcopy({**base, **kwargs}))
    # the config as given, before building the module can fill in rope parameters, as
    # save_pretrained writes it to config.json, and as a dict of the keys given
    fresh = (copy.deepcopy(config), config.to_dict(),
             json.loads(config.to_json_string(use_diff=True)))
    positions = np.array([0, 5, 60, 127, 200])
    module = _module_cos(model_type, config, positions, layer_type)
    for given in (config, config.to_dict()) + fresh + (given_keys,):
        try:
            rope = fastpe.RotaryEmbedding.from_hf_config(given, layer_type=layer_type)
        except ValueError:
            # keys the class derives more from (layer types, per-layer widths): refused
            assert given is given_keys
            continue
        cos, _ = rope.cos_sin(positions, dtype="float64")
        want = (module if model_type == "gptj" else module[:, 0::2] if rope.style == "gptj"
                else module[:, : module.shape[-1] // 2])
        assert cos.shape == want.shape
        np.testing.assert_allclose(cos, want, rtol=0, atol=3e-5)   # the module's float32


def test_mimo_v2_flash_width_that_depends_on_build_order_is_refused():
    # the default-type layer reads 0.334 of the head if built before the llama3 layer
    # copies the top-level factor into its entry, and the top-level 0.25 after
    config = transformers.AutoConfig.for_model(
        "mimo_v2_flash", hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=96, partial_rotary_factor=0.25, rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e3},
            "sliding_attention": {"rope_type": "llama3", "rope_theta": 5e2, "factor": 4.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 16}})
    fresh = copy.deepcopy(config)
    built = _module_cos("mimo_v2_flash", config, np.array([1]), "full_attention")
    assert built.shape[-1] == 32   # int(96 * 0.334), before the copy
    for given in (fresh, config):  # the second holds the copied factor
        with pytest.raises(ValueError, match="depends on that order"):
            fastpe.RotaryEmbedding.from_hf_config(given, layer_type="full_attention")


def test_dots3_proportional_rope_wider_than_the_rotated_part_is_refused():
    # the sliding layers' head_dim is 256 (the class's per-layer value): proportional RoPE
    # spans it while the attention rotates qk_rope_head_dim=64 features, and transformers'
    # own attention fails on the shapes
    config = transformers.AutoConfig.for_model(
        "dots3_note_text", hidden_size=128, num_attention_heads=4, num_key_value_heads=4,
        qk_rope_head_dim=64, qk_nope_head_dim=64, head_dim=64, num_hidden_layers=2,
        intermediate_size=64, vocab_size=100, pad_token_id=0,
        layer_types=["sliding_attention", "indexed_attention"], rope_parameters={
            "sliding_attention": {"rope_type": "proportional", "rope_theta": 61.9,
                                  "partial_rotary_factor": 0.25},
            "indexed_attention": {"rope_type": "linear", "rope_theta": 4.2e6, "factor": 5.0,
                                  "partial_rotary_factor": 1.0}})
    with pytest.raises(RuntimeError):
        transformers.AutoModel.from_config(config)(torch.tensor([[1, 2, 3]]))
    for given in (config, config.to_dict()):
        with pytest.raises(ValueError, match="head_dim 256 differs from qk_rope_head_dim=64"):
            fastpe.RotaryEmbedding.from_hf_config(given, layer_type="sliding_attention")


def test_a_position_embedding_type_the_family_code_never_reads_is_ignored():
    # Command-R7B's config.json says position_embedding_type "rope_gptj"; Cohere 2's code
    # reads no such key (its rotation is the interleaved one anyway)
    config = transformers.AutoConfig.for_model(
        "cohere2", hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=4, position_embedding_type="rope_gptj",
        rope_parameters={"rope_type": "default", "rope_theta": 5e4})
    positions = np.array([0, 5, 77, 300])
    module = _module_cos("cohere2", config, positions)
    for given in (config, config.to_dict()):
        rope = fastpe.RotaryEmbedding.from_hf_config(given, layer_type="sliding_attention")
        cos, _ = rope.cos_sin(positions, dtype="float64")
        assert rope.style == "gptj"
        np.testing.assert_allclose(cos, module[:, 0::2], rtol=0, atol=3e-5)


@pytest.mark.parametrize("change", ["config-edited", "inv_freq-rescaled", "inv_freq-replaced"])
def test_a_rotary_module_whose_frequencies_left_its_config_is_refused(change):
    """fastpe.hf reads the config; the module rotates by its own inv_freq buffer. Where
    they differ patch() raises and leaves the model stock (a model's float16 copy of
    the same frequencies is accepted: test_inference_mode_and_float16)."""
    model = text_model("llama")
    rotary = model.model.rotary_emb
    if change == "config-edited":
        model.config.rope_parameters = {"rope_type": "linear", "rope_theta": 10000.0,
                                        "factor": 4.0}
    elif change == "inv_freq-rescaled":
        with torch.no_grad():
            rotary.inv_freq.mul_(0.25)
    else:
        rotary.inv_freq = rotary.inv_freq * 0.25
    ids = prompt("llama")["input_ids"]
    with torch.no_grad():
        want = model(ids).logits
        with pytest.raises(ValueError, match=r"holds inv_freq other than its config gives"):
            fastpe.hf.patch(model)
        assert "forward" not in vars(rotary)
        torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=0)


def _dynamic_llama():
    return text_model("llama", max_position_embeddings=16, rope_parameters={
        "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})


def test_a_dynamic_ntk_module_built_for_another_length_is_refused():
    """transformers' dynamic NTK module grows past the max_position_embeddings it was
    built with, but forms grown frequencies from the config's: a config whose length
    was edited since is both at once, which fastpe does not reproduce."""
    model = _dynamic_llama()
    model.config.max_position_embeddings = 8
    with pytest.raises(ValueError, match=r"past 16 positions.*max_position_embeddings is 8"):
        fastpe.hf.patch(model)
    assert "forward" not in vars(model.model.rotary_emb)


@pytest.mark.parametrize("edit", ["to-default", "to-dynamic"])
def test_a_rope_type_edited_to_or_from_dynamic_before_patch_is_refused(edit):
    """A module built with dynamic NTK grows its frequencies past its length, one built
    with the default rope type never does, and both hold the same frequencies until then:
    a config edited from one to the other since the build is refused at patch, where
    fastpe would grow where the module does not (or not where it does)."""
    built, edited = ("dynamic", "default") if edit == "to-default" else ("default", "dynamic")
    model = text_model("llama", max_position_embeddings=16, rope_parameters={
        "rope_type": built, "rope_theta": 10000.0, "factor": 2.0})
    model.config.rope_parameters["rope_type"] = edited
    with pytest.raises(ValueError, match=rf"was built with rope type '{built}', its config now "
                                         rf"gives '{edited}'"):
        fastpe.hf.patch(model)
    assert "forward" not in vars(model.model.rotary_emb)


def test_a_modeling_function_replaced_after_patch_runs_in_the_patched_model(monkeypatch):
    """A function of the modeling module replaced after patch (as another library's
    patcher replaces it) is what the patched attention runs next, as the stock one does."""
    llama_module = transformers.models.llama.modeling_llama
    stock = text_model("llama", attn_implementation="eager")
    model = fastpe.hf.patch(text_model("llama", attn_implementation="eager"))
    original = llama_module.eager_attention_forward

    def louder(*args, **kwargs):
        out, weights = original(*args, **kwargs)
        return out * 3.0, weights

    ids = torch.randint(3, 160, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        before = stock(ids).logits
        torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=2e-5)
        monkeypatch.setattr(llama_module, "eager_attention_forward", louder)
        want = stock(ids).logits
        assert not torch.allclose(want, before, rtol=0, atol=1e-3)
        torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=2e-5)
        monkeypatch.undo()
        torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=2e-5)


def test_a_config_of_a_model_type_transformers_does_not_know_is_refused():
    """A config class of the user's (a fine-tune registered under its own model_type) on
    a transformers family's model: fastpe reads a config's rotation by its model type,
    and one transformers does not know would be read as Llama's (rotate_half), where
    Cohere's code turns adjacent pairs. Refused at patch, the model unchanged."""

    class TunedCohereConfig(transformers.CohereConfig):
        model_type = "tuned_cohere_for_fastpe_tests"

    torch.manual_seed(0)
    model = transformers.CohereForCausalLM(TunedCohereConfig(**SMALL)).eval()
    assert_refused_unchanged(model, r"model type 'tuned_cohere_for_fastpe_tests', which "
                                    r"transformers does not know \(its config class "
                                    r"derives from transformers' 'cohere' config\)")


def test_a_dynamic_ntk_config_edited_after_patch_is_refused_when_it_grows():
    """transformers reads the config's factor again at each growth of its dynamic NTK
    frequencies; a patched model whose factor was edited since raises there, where it
    would rotate by the factor it was patched with."""
    stock, model = _dynamic_llama(), fastpe.hf.patch(_dynamic_llama())
    ids = torch.randint(3, 160, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(ids[:, :24]).logits, stock(ids[:, :24]).logits,
                                   rtol=0, atol=2e-5)
        model.config.rope_parameters["factor"] = 8.0
        model(ids[:, :24])   # no growth: the frequencies of 24 positions, formed before
        with pytest.raises(ValueError, match=r"for 40 positions differ .* patch the model again"):
            model(ids)


@pytest.mark.parametrize("edit", ["long_factor", "threshold"])
def test_a_longrope_config_edited_after_patch_is_refused(edit):
    """transformers reads LongRoPE's length threshold from the config at every call and
    forms the long factors' frequencies from it at the module's first call, then keeps
    them: a patched model whose threshold was edited since, or whose first call comes
    after an edit of the factors, raises where it would rotate by what it was patched
    with; one that kept them before the edit rotates as its stock copy does."""
    def build():   # long factors past 12 positions (Phi3Config's own length sets it)
        return text_model("phi3", max_position_embeddings=64, original_max_position_embeddings=12,
                          rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                           "short_factor": [1.0 + 0.1 * i for i in range(8)],
                                           "long_factor": [2.0 + 0.5 * i for i in range(8)]})
    stock, model = build(), fastpe.hf.patch(build())
    assert model.config.rope_parameters["original_max_position_embeddings"] == 12
    ids = torch.randint(3, 160, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, stock(ids).logits, rtol=0, atol=2e-5)
    fresh = fastpe.hf.patch(build())   # no call yet: nothing kept
    for m in (stock, model, fresh):
        if edit == "long_factor":
            m.config.rope_parameters["long_factor"] = [3.0 + 0.5 * i for i in range(8)]
        else:
            m.config.rope_parameters["original_max_position_embeddings"] = 16
    with torch.no_grad():
        if edit == "threshold":
            for patched in (model, fresh):
                with pytest.raises(ValueError, match=r"original_max_position_embeddings 16, "
                                                     r"fastpe\.hf\.patch read 12"):
                    patched(ids[:, :14])
            return
        # both kept the factors of their first call, from the config as it was
        torch.testing.assert_close(model(ids).logits, stock(ids).logits, rtol=0, atol=2e-5)
        # a first call now forms them from the edited config
        with pytest.raises(ValueError, match=r"keeps long_inv_freq .* other than"):
            fresh(ids[:, :14])
    # patched after the edit, fastpe would read the edited factors, the stock model rotates
    # by those it kept
    with pytest.raises(ValueError, match=r"keeps long_inv_freq .* other than"):
        fastpe.hf.patch(stock)


@pytest.mark.parametrize("build", [lambda: text_model("llama"), _dynamic_llama],
                         ids=["default", "dynamic"])
def test_negative_position_ids_of_left_padding_rotate_as_the_model_does(build):
    """Left padding written as attention_mask.cumsum(-1) - 1 puts the padded tokens at
    -1; the model's own code rotates them by negative angles (and masks them), as the
    patched model does; the frequencies are those of max(position_ids) + 1."""
    stock = build()
    patched = fastpe.hf.patch(copy.deepcopy(stock))
    ids = torch.randint(3, 160, (2, 24), generator=torch.Generator().manual_seed(3))
    ids[1, :5] = 0
    mask = (ids != 0).long()
    positions = mask.cumsum(-1) - 1
    assert positions.min() == -1
    with torch.no_grad():
        for n in (24, 20):   # past the dynamic module's 16 positions, then kept
            want = stock(ids[:, :n], attention_mask=mask[:, :n],
                         position_ids=positions[:, :n]).logits
            got = patched(ids[:, :n], attention_mask=mask[:, :n],
                          position_ids=positions[:, :n]).logits
            torch.testing.assert_close(got, want, rtol=0, atol=2e-5)


def test_an_m_rope_module_whose_sections_left_its_config_is_refused():
    """Qwen2-VL's rotary module keeps the mrope_section it was built with; a config edited
    afterwards would have fastpe turn the same frequencies by other axes."""
    model = qwen2_vl()
    model.config.text_config.rope_parameters["mrope_section"] = [4, 2, 2]
    inputs = prompt("qwen2_vl")
    with torch.no_grad():
        want = model(**inputs).logits
        with pytest.raises(ValueError, match=r"holds mrope_section \[2, 3, 3\], its config "
                                             r"gives \[4, 2, 2\]"):
            fastpe.hf.patch(model)
        torch.testing.assert_close(model(**inputs).logits, want, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["phi3_longrope", "llama_dynamic"])
def test_a_model_patched_after_a_long_call_matches_its_stock_copy(name):
    """LongRoPE and dynamic NTK modules swap inv_freq as calls pass the original length:
    patching after such a call is accepted (their original frequencies are checked)."""
    model = FAMILIES[name][0]()
    long_ids = torch.arange(1, 41).reshape(1, 40) % SMALL["vocab_size"]
    with torch.no_grad():
        model(long_ids)
        stock = copy.deepcopy(model)
        fastpe.hf.patch(model)
        for ids in (long_ids, long_ids[:, :6]):
            torch.testing.assert_close(model(ids).logits, stock(ids).logits,
                                       rtol=0, atol=2e-5)


def _positions_matter(model):
    """Weights large enough that the logits depend on the positions (a tiny model's
    default init barely does)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.normal_(0, m.in_features ** -0.5)
    return model


def test_a_text_mrope_module_holding_its_spectrum_in_axis_order_is_patched():
    """ERNIE-4.5-VL's text rotary module holds its frequencies in its axes' order, not
    the spectrum's: the same values, which fastpe's pair layout reproduces."""
    text = dict(vocab_size=160, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, pad_token_id=0,
                rope_parameters={"rope_type": "default", "rope_theta": 500000.0,
                                 "mrope_section": [2, 2, 4]},
                moe_intermediate_size=[32, 32], moe_k=2, moe_num_experts=4,
                moe_num_shared_experts=1, mlp_layer_types=["dense", "sparse"])
    torch.manual_seed(0)
    model = _positions_matter(transformers.Ernie4_5_VLMoeForConditionalGeneration(
        transformers.Ernie4_5_VLMoeConfig(
            text_config=text, vision_config=dict(depth=1, hidden_size=32, intermediate_size=64,
                                                 num_heads=2, patch_size=4),
            image_token_id=150, video_token_id=151, image_start_token_id=152,
            image_end_token_id=153)).eval())
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4]])
    with torch.no_grad():
        want = model(ids).logits
        got = fastpe.hf.patch(model)(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5 * float(want.abs().max()))


def test_esm_rotary_module_with_an_optional_layer_type_is_one_embedding(monkeypatch):
    """ESM-2's rotary module takes layer_type=None and its config lists no layer types:
    one embedding, as its forward makes; masked-LM logits as stock's."""
    config = transformers.EsmConfig(vocab_size=33, hidden_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=128,
                                    position_embedding_type="rotary", pad_token_id=1,
                                    mask_token_id=32, token_dropout=False, initializer_range=0.3)
    torch.manual_seed(0)
    model = transformers.EsmForMaskedLM(config).eval()
    ids = torch.randint(4, 30, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        stock = model(ids).logits
        fastpe.hf.patch(model)
        calls = count_rotations(monkeypatch)
        torch.testing.assert_close(model(ids).logits, stock, rtol=0, atol=2e-5)
    assert len(calls) == 2


def test_gptj_table_is_checked_whole_and_again_when_written(monkeypatch):
    """GPT-J's sin|cos table is checked row by row at patch and again at the next forward
    after it was written or replaced (a cast to bfloat16 and back rounds it); negative
    position_ids index it from its end, as the stock lookup does."""
    model = FAMILIES["gptj"][0]()
    with torch.no_grad():
        model.transformer.rotary_emb.embed_positions[700:900] *= 0.5   # rows in the middle
    with pytest.raises(ValueError, match=r"GPTJRotaryEmbedding .* gives \(sin, cos\) other"):
        fastpe.hf.patch(model)
    model = FAMILIES["gptj"][0]()
    ids = torch.arange(1, 9)[None]
    mixed = torch.arange(-3, 5)[None]
    with torch.no_grad():
        stock = model(ids, position_ids=mixed).logits
        fastpe.hf.patch(model)
        torch.testing.assert_close(model(ids, position_ids=mixed).logits, stock, rtol=0,
                                   atol=2e-4)   # rows 2045-2047: stock's float32 angles
        with pytest.raises(ValueError, match=r"position_ids below -2048"):
            model(ids, position_ids=mixed - 2048)
        model(ids)
        model.transformer.rotary_emb.embed_positions[100] *= 0.5   # written in place
        with pytest.raises(ValueError, match=r"cast to half precision and back"):
            model(ids)
        fastpe.hf.unpatch(model)
        model = fastpe.hf.patch(FAMILIES["gptj"][0]())
        model.to(torch.bfloat16).float()   # rounds the table: another tensor
        with pytest.raises(ValueError, match=r"cast to half precision and back"):
            model(ids)
    # a table module whose forward returns (cos, sin): not what it is read as
    swapped = FAMILIES["gptj"][0]()
    module = swapped.transformer.rotary_emb
    monkeypatch.setattr(type(module), "forward",
                        lambda self, x, position_ids: tuple(reversed(torch.split(
                            self.embed_positions[position_ids], 4, dim=-1))))
    with pytest.raises(ValueError, match=r"GPTJRotaryEmbedding .* gives \(sin, cos\) other"):
        fastpe.hf.patch(swapped)


def test_llama4_vision_tower_is_left_stock_and_its_text_model_patched():
    """Llama 4's vision rotary module makes its freqs_cis from the hidden states alone
    (no position_ids): left stock, while the text model's complex freqs_cis is patched."""
    config = transformers.Llama4Config(
        text_config=dict(SMALL, head_dim=HEAD_DIM, intermediate_size_mlp=128,
                         num_local_experts=2),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, image_size=28, patch_size=14,
                           vision_output_dim=64, projector_input_dim=64,
                           projector_output_dim=64),
        image_token_index=IMAGE_TOKEN)
    torch.manual_seed(0)
    model = transformers.Llama4ForConditionalGeneration(config).eval()
    ids = torch.arange(1, 9)[None]
    far = torch.arange(2000, 2008)[None]
    with torch.no_grad():
        stock = model(input_ids=ids, position_ids=far).logits
        fastpe.hf.patch(model)
        patched = {type(m).__name__ for m, _ in model._fastpe_hf_patched}
        assert patched == {"Llama4TextRotaryEmbedding", "Llama4TextAttention"}
        torch.testing.assert_close(model(input_ids=ids, position_ids=far).logits, stock,
                                   rtol=0, atol=2e-4)   # stock's float32 angles at 2000


def test_pixtral_tower_is_left_stock_and_its_text_model_patched():
    """Pixtral's rotary module looks its cos and sin up by flat patch ids over the
    largest image's grid: its tower runs stock, the text model through fastpe."""
    torch.manual_seed(0)
    model = _positions_matter(transformers.Mistral3ForConditionalGeneration(
        transformers.Mistral3Config(
            vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64,
                               num_hidden_layers=1, num_attention_heads=2, image_size=64,
                               patch_size=8, head_dim=16),
            text_config=dict(model_type="mistral", vocab_size=160, hidden_size=32,
                             intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=16),
            image_token_index=10)).eval())
    ids = torch.tensor([[1, 5, 9] + [10] * 6 + [2, 7]])
    pixels = torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    inputs = dict(input_ids=ids, pixel_values=pixels, image_sizes=torch.tensor([[32, 48]]))
    with torch.no_grad():
        want = model(**inputs).logits
        fastpe.hf.patch(model)
        got = model(**inputs).logits
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5 * float(want.abs().max()))
    patched = {type(m).__name__ for m in model.modules() if "forward" in vars(m)}
    assert "MistralRotaryEmbedding" in patched and "PixtralRotaryEmbedding" not in patched


def test_kimi_k25_tower_rotates_its_one_sequence_q_and_k():
    """Kimi-K2.5's vision attention hands its apply function q and k of one sequence,
    (1, tokens, heads, dim): each tower attention's output is its stock one (its pairs
    alternate column and row), where another pair layout is thousands of times further
    off."""
    from transformers.models.kimi_k25 import modeling_kimi_k25 as kimi
    text = dict(model_type="deepseek_v3", vocab_size=160, hidden_size=64, intermediate_size=128,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                v_head_dim=8, moe_intermediate_size=32, n_routed_experts=4,
                num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1)
    vision = dict(patch_size=4, pos_emb_height=8, pos_emb_width=8, pos_emb_time=4,
                  num_attention_heads=2, num_hidden_layers=2, hidden_size=32,
                  intermediate_size=64)
    torch.manual_seed(0)
    model = kimi.Kimi_K25ForConditionalGeneration(transformers.Kimi_K25Config(
        text_config=text, vision_config=vision, projection_hidden_size=32, image_token_id=150,
        video_token_id=151, vision_start_token_id=152, vision_end_token_id=153)).eval()
    tower = model.model.vision_tower
    with torch.no_grad():
        for name, p in tower.named_parameters():
            if ("q_proj" in name or "k_proj" in name) and p.ndim == 2:
                p.normal_(0, 1.5)     # attention that depends on the positions
    outputs = []
    for layer in tower.layers:
        layer.attn.register_forward_hook(
            lambda m, a, out: outputs.append(out[0] if isinstance(out, tuple) else out))
    pixels = torch.randn(24, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([[1, 5, 152] + [150] * 6 + [153, 3]])
    inputs = dict(input_ids=ids, pixel_values=pixels, image_grid_thw=torch.tensor([[1, 4, 6]]))
    with torch.no_grad():
        want = model(**inputs).logits
        stock = [o.clone() for o in outputs]
        outputs.clear()
        fastpe.hf.patch(model)
        got = model(**inputs).logits
    assert {"Kimi_K25VisionRotaryEmbedding", "Kimi_K25VisionAttention"} <= {
        type(m).__name__ for m in model.modules() if "forward" in vars(m)}
    for o, w in zip(outputs, stock, strict=True):
        torch.testing.assert_close(o, w, rtol=0, atol=1e-5 * float(w.abs().max()))
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5 * float(want.abs().max()))


def _mlcd():
    torch.manual_seed(0)
    model = transformers.MLCDVisionModel(transformers.MLCDVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        patch_size=2, image_size=8)).eval()
    return model, (torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1)),)


def _gemma4_tower():
    from transformers.models.gemma4.modeling_gemma4 import Gemma4VisionModel
    torch.manual_seed(0)
    model = Gemma4VisionModel(transformers.Gemma4VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, patch_size=2, pooling_kernel_size=2)).eval()
    rows, cols = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    return model, (torch.randn(1, 16, 12, generator=torch.Generator().manual_seed(1)),
                   torch.stack([cols.flatten(), rows.flatten()], -1)[None])


@pytest.mark.parametrize("build, why", [(_mlcd, "prepends the class token's cos and sin"),
                                        (_gemma4_tower, "takes the patches' position_ids")])
def test_towers_that_use_cos_and_sin_beyond_the_apply_function_are_refused(build, why):
    """MLCD's vision model concatenates its class token's cos and sin to the rotary
    module's; Gemma 4's apply function reads the patch positions itself: patch() refuses
    such a model (its forward would fail patched) and leaves it stock."""
    model, inputs = build()
    with torch.no_grad():
        want = model(*inputs).last_hidden_state
        with pytest.raises(ValueError, match=why):
            fastpe.hf.patch(model)
        assert not any("forward" in vars(m) for m in model.modules())
        torch.testing.assert_close(model(*inputs).last_hidden_state, want, rtol=0, atol=0)


def test_qwen4_exp_text_model_is_left_stock_and_its_tower_patched():
    """Qwen4-Exp's attention and indexer slice cos and sin before applying them: its text
    model runs stock, its tower through fastpe."""
    text = dict(vocab_size=160, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                linear_num_value_heads=4, layer_types=["linear_attention", "indexed_attention"],
                rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                 "mrope_section": [1, 1, 2], "mrope_interleaved": True,
                                 "partial_rotary_factor": 0.5},
                indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8,
                indexer_compress_ratio=2, moe_intermediate_size=32,
                shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                hc_count=2, hc_lowrank=8)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
                  num_position_embeddings=16)
    torch.manual_seed(0)
    model = transformers.Qwen4ExpForConditionalGeneration(transformers.Qwen4ExpConfig(
        text_config=text, vision_config=vision, image_token_id=150, video_token_id=151,
        vision_start_token_id=152, vision_end_token_id=153)).eval()
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        fastpe.hf.patch(model)
        got = model(input_ids=ids).logits
    patched = {n for n, m in model.named_modules() if "forward" in vars(m)}
    assert patched and all(n.startswith("model.visual.") for n in patched)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_vision_tower_that_reorders_cos_and_sin_is_left_stock():
    """Qwen2.5-VL's vision tower puts its rotary cos and sin in window order before its
    blocks apply them: patch() leaves that tower (its rotary module and blocks) stock and
    patches the text model; the model's outputs are its stock ones."""
    config = transformers.Qwen2_5_VLConfig(
        text_config=dict(SMALL, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                 "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                           patch_size=4, temporal_patch_size=2, spatial_merge_size=2,
                           out_hidden_size=SMALL["hidden_size"], window_size=16,
                           fullatt_block_indexes=[1]),
        image_token_id=IMAGE_TOKEN, video_token_id=151, vision_start_token_id=152,
        vision_end_token_id=153)
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    inputs = prompt("qwen2_vl")
    with torch.no_grad():
        want = model(**inputs).logits
        fastpe.hf.patch(model)
        got = model(**inputs).logits
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    patched = {name for name, m in model.named_modules() if "forward" in vars(m)}
    assert "model.language_model.rotary_emb" in patched
    assert not any(name.startswith("model.visual") for name in patched), patched


def test_a_config_object_with_flat_rope_parameters_beside_entries_is_refused_without_advice():
    """Gemma3TextConfig given one flat rope dict keeps it beside its default entries per
    layer type (the model runs those): refused, naming both, without telling a caller who
    gave the config object to give the config object."""
    config = transformers.Gemma3TextConfig(**SMALL, rope_parameters={
        "rope_type": "linear", "rope_theta": 1e4, "factor": 2.0})
    with pytest.raises(ValueError, match=r"per layer type \(.*attention.*\) beside flat keys "
                                         r"\(.*factor.*\)") as err:
        fastpe.RotaryEmbedding.from_hf_config(config, layer_type="full_attention")
    assert "give the config object" not in str(err.value)


@pytest.mark.parametrize("name", ["llama", "deberta"])
def test_a_pickled_patched_model_loads_stock_and_patches_again(name, monkeypatch):
    """pickle keeps neither patch()'s closures nor its rebuilt functions: the copy it loads
    runs the stock code, and patch() on it patches it (the patch it remembers is dropped)."""
    import io
    if name == "llama":
        model = fastpe.hf.patch(text_model("llama", initializer_range=0.4))
        ids = prompt("llama")["input_ids"]
    else:
        model = fastpe.hf.patch(deberta(position_buckets=32, max_relative_positions=64,
                                        pos_att_type=["p2c", "c2p"]))
        ids = torch.arange(1, 41)[None]
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    with torch.no_grad():
        patched = model(ids).logits
        stock = fastpe.hf.unpatch(copy.deepcopy(model))(ids).logits
        calls = count_disentangled(monkeypatch)
        assert torch.equal(loaded(ids).logits, stock) and not calls
        again = fastpe.hf.patch(loaded)(ids).logits
        assert torch.equal(again, patched)
        if name == "llama":  # float64 angles; DeBERTa's patched model is stock's bit for bit
            assert not torch.equal(again, stock)
        else:
            # the two probes', then the two layers' passes
            assert calls[2:] == [(4, 40, 40)] * 2
        assert torch.equal(fastpe.hf.unpatch(loaded)(ids).logits, stock)


@pytest.mark.parametrize("order", ["patch-then-compile", "compile-then-patch"])
def test_torch_compile_runs_the_patched_rotation_between_its_graphs(order):
    """torch.compile cannot trace fastpe's C call on the tensors' memory, nor the NumPy
    reads of a module's buffers: the patched forwards run as graph breaks, with the
    patched model's numbers (dynamo's "eager" backend: the tracing, not the codegen)."""
    model = text_model("llama", initializer_range=0.4)
    ids = prompt("llama")["input_ids"]
    with torch.no_grad():
        stock = model(ids).logits
        want = fastpe.hf.patch(copy.deepcopy(model))(ids).logits
        if order == "patch-then-compile":
            compiled = torch.compile(fastpe.hf.patch(model), backend="eager")
        else:
            compiled = torch.compile(model, backend="eager")
            fastpe.hf.patch(model)
        got = compiled(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert not torch.equal(got, stock)


def test_torch_compile_fullgraph_names_fastpe_as_the_graph_break():
    """fullgraph=True cannot run the patched forwards between graphs: dynamo's error says
    why and what to do, not only that a disabled function was met."""
    model = fastpe.hf.patch(text_model("llama"))

    # a frame of its own: dynamo would reuse the model's forward compiled by other tests
    # without fullgraph
    @torch.compile(backend="eager", fullgraph=True)
    def logits(ids):
        return model(ids).logits

    with torch.no_grad(), pytest.raises(Exception, match=r"fastpe\.hf: a patched model rotates "
                                                          r"q and k .* fullgraph=False"):
        logits(prompt("llama")["input_ids"])


class _Holder(torch.nn.Module):
    """A module of the user's own around a model."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


def _patched_forwards(model):
    return [name for name, m in model.named_modules() if "forward" in vars(m)]


def test_patch_and_unpatch_reach_a_model_through_torch_compile_and_holders():
    """torch.compile's wrapper reads attributes through to the model but keeps its own:
    patch() and unpatch() act on the model it runs, either way round. A patch made
    through a module holding the model, or through one inside it, is undone by unpatch()
    on any of them; patching the model over it is refused, not mistaken for accelerate's
    hooks."""
    stock = text_model("llama", initializer_range=0.4)
    ids = prompt("llama")["input_ids"]
    with torch.no_grad():
        want = stock(ids).logits
    model = fastpe.hf.patch(copy.deepcopy(stock))
    compiled = torch.compile(model, backend="eager")
    assert fastpe.hf.unpatch(compiled) is compiled
    assert not _patched_forwards(model) and not hasattr(model, "_fastpe_hf_patched")

    compiled = torch.compile(model, backend="eager")
    assert fastpe.hf.patch(compiled) is compiled
    assert fastpe.hf.patch(model) is model                    # patched already: nothing
    assert _patched_forwards(model) and model._fastpe_hf_patched
    fastpe.hf.unpatch(model)
    assert not _patched_forwards(model)

    # patched through a holder, then the model asked; patched through its inner model,
    # then the model asked
    for patched_through, asked in ((_Holder(model), model), (model.model, model)):
        fastpe.hf.patch(patched_through)
        with pytest.raises(ValueError, match=r"patched already, through another module: .*"
                                             r"fastpe\.hf\.unpatch\(model\) undoes"):
            fastpe.hf.patch(asked)
        assert not hasattr(asked, "_fastpe_hf_patched")
        fastpe.hf.unpatch(asked)
        assert not _patched_forwards(model)
        with torch.no_grad():
            assert torch.equal(model(ids).logits, want)
        fastpe.hf.patch(patched_through)                      # its stale record is dropped
        assert _patched_forwards(model)
        fastpe.hf.unpatch(patched_through)
        assert not _patched_forwards(model)
        assert not hasattr(patched_through, "_fastpe_hf_patched")


class _LastHidden(torch.nn.Module):
    """A model's last hidden state alone, for torch.jit.trace."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, ids):
        return self.inner(ids, use_cache=False).last_hidden_state


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore:To copy construct from a tensor")
@pytest.mark.filterwarnings("ignore:`torch.jit.trace")
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated")
@pytest.mark.parametrize("name", ["llama", "deberta"])
def test_torch_jit_trace_of_a_patched_model_is_refused(name):
    """torch.jit.trace records the tensor operations around fastpe's C call, not the
    call: its graph would replay the model unrotated (other numbers, silently). So
    torch.export and make_fx, whose fake tensors hold no memory to rotate, are refused
    by name too."""
    if name == "llama":
        model = fastpe.hf.patch(text_model("llama")).model
        ids = prompt("llama")["input_ids"]
    else:
        model = fastpe.hf.patch(deberta(position_buckets=32, max_relative_positions=64,
                                        pos_att_type=["p2c", "c2p"])).deberta
        ids = torch.arange(1, 21)[None]
    with torch.no_grad():
        with pytest.raises(RuntimeError, match=r"cannot be traced by torch\.jit\.trace: .* "
                                               r"fastpe\.hf\.unpatch\(model\)"):
            torch.jit.trace(_LastHidden(model), (ids,), check_trace=False)
        with pytest.raises(RuntimeError, match=r"cannot be exported or traced into a graph"):
            torch.export.export(_LastHidden(model), (ids,), strict=False)


def test_a_model_on_the_meta_device_is_refused_by_name():
    """The meta device holds no values to rotate by: patch() and a patched model moved
    there raise a ValueError that says so (the stock model's meta forward infers shapes)."""
    model = text_model("llama")
    with pytest.raises(ValueError, match=r"meta device"):
        fastpe.hf.patch(copy.deepcopy(model).to("meta"))
    moved = fastpe.hf.patch(model).to("meta")
    with torch.no_grad(), pytest.raises(ValueError, match=r"meta device"):
        moved(prompt("llama")["input_ids"].to("meta"))


def test_a_torch_whose_dynamo_cannot_disable_still_patches(monkeypatch):
    """Where torch's compiler is unavailable nothing is compiled around the patched
    forwards: patch() runs them as they are."""
    import torch._dynamo

    def unavailable(*args, **kwargs):
        raise RuntimeError("no dynamo here")

    model = text_model("llama", initializer_range=0.4)
    ids = prompt("llama")["input_ids"]
    with torch.no_grad():
        want = fastpe.hf.patch(copy.deepcopy(model))(ids).logits
    with monkeypatch.context() as m:
        m.setattr(torch._dynamo, "disable", unavailable)
        fastpe.hf.patch(model)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=0)


@pytest.mark.parametrize("rope_type", ["linear", "longrope"])
def test_a_phimoe_config_edited_after_patch_is_refused(rope_type):
    """Phi-3.5-MoE's rotary module forms its frequencies and picks its mscale from the
    config at every call: a patched model whose rope parameters were edited since raises,
    where it would rotate by those it was patched with."""
    stock = FAMILIES[f"phimoe_{rope_type}"][0]()
    model = fastpe.hf.patch(copy.deepcopy(stock))
    ids = torch.randint(3, 160, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = stock(ids).logits
        torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=2e-5)
        for m in (stock, model):
            m.config.rope_parameters["long_mscale"] = 1.5
        assert not torch.allclose(stock(ids).logits, before)   # the stock model follows it
        with pytest.raises(ValueError, match=r"rope_parameters were edited after "
                                             r"fastpe\.hf\.patch read them"):
            model(ids)


def _scale_attention(model):
    model.model.rotary_emb.attention_scaling = 0.5


def _write_dynamic_inv_freq(model):
    model.model.rotary_emb.inv_freq.mul_(1.5)


def _edit_mrope_section(model):
    # the module holds its config's own list: an edit of the one is an edit of the other
    model.config.text_config.rope_parameters["mrope_section"][:] = [4, 1, 3]


@pytest.mark.parametrize("build, change, match", [
    (lambda: text_model("llama"), _scale_attention,
     r"holds attention_scaling 0\.5, its config gives 1\.0"),
    (_dynamic_llama, _write_dynamic_inv_freq,
     r"dynamic NTK frequencies for 16 positions differ .* inv_freq written or replaced"),
    (qwen2_vl, _edit_mrope_section,
     r"mrope_section is now \[4, 1, 3\], fastpe\.hf\.patch read \[2, 3, 3\]"),
], ids=["attention_scaling", "dynamic-inv_freq", "mrope_section"])
def test_rotary_state_written_after_patch_is_refused(build, change, match):
    """What a rotary module's forward reads at every call (its attention scaling, a dynamic
    NTK module's inv_freq, an M-RoPE module's mrope_section) changed after patch: the
    stock model rotates by the new state, so the patched one raises, never rotating by the
    old one."""
    family = "qwen2_vl" if build is qwen2_vl else "llama"
    stock, model = build(), fastpe.hf.patch(build())
    with torch.no_grad():
        want = stock(**prompt(family)).logits
        torch.testing.assert_close(model(**prompt(family)).logits, want, rtol=0, atol=2e-5)
        for m in (stock, model):
            change(m)
        assert not torch.allclose(stock(**prompt(family)).logits, want)
        with pytest.raises(ValueError, match=match):
            model(**prompt(family))


def test_dynamic_ntk_frequencies_grown_before_an_edit_are_refused_at_patch():
    """A dynamic NTK module grown past its original length holds frequencies formed from
    its config as it was; patched after the config's factor was edited, fastpe would read
    the new factor where the stock model rotates by the grown frequencies until its next
    growth or reset."""
    model = _dynamic_llama()
    ids = torch.randint(3, 160, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model(ids)
    model.config.rope_parameters["factor"] = 4.0
    with pytest.raises(ValueError, match=r"dynamic NTK frequencies for 40 positions differ"):
        fastpe.hf.patch(model)


def test_a_learned_alpha_on_the_frequencies_is_followed():
    """Mistral Large 4's rotary module multiplies every frequency by exp(alpha), a
    parameter its checkpoint sets (zero at init): the patched model rotates by fastpe's
    frequencies times exp(alpha), alpha loaded before patch or after it, as its stock copy
    does."""
    config = transformers.MistralLarge4TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
        num_experts_per_tok=2, kv_lora_rank=16, qk_rope_head_dim=8, v_head_dim=16,
        qk_nope_head_dim=8, head_dim=8, index_topk=8, index_head_dim=16, index_n_heads=2,
        max_position_embeddings=256)

    def build():
        torch.manual_seed(0)
        return transformers.MistralLarge4TextModel(copy.deepcopy(config)).eval()

    ids = torch.arange(1, 41)[None]
    stock, model, loaded = build(), fastpe.hf.patch(build()), build()
    alpha = torch.linspace(-0.5, 0.5, model.rotary_emb.alpha.numel())
    with torch.no_grad():
        want = stock(ids).last_hidden_state
        torch.testing.assert_close(model(ids).last_hidden_state, want, rtol=0, atol=2e-5)
        for m in (stock, model, loaded):
            m.rotary_emb.alpha.copy_(alpha)
        want = stock(ids).last_hidden_state
        torch.testing.assert_close(model(ids).last_hidden_state, want, rtol=0, atol=2e-5)
        fastpe.hf.patch(loaded)
        torch.testing.assert_close(loaded(ids).last_hidden_state, want, rtol=0, atol=2e-5)
        model.rotary_emb.alpha.zero_()
        stock.rotary_emb.alpha.zero_()
        torch.testing.assert_close(model(ids).last_hidden_state, stock(ids).last_hidden_state,
                                   rtol=0, atol=2e-5)


def test_sam3_vit_is_refused_at_patch():
    """SAM 3's ViT rotates q of (batch * windows, heads, tokens, dim) with cos and sin given
    as keywords, which fastpe.hf cannot lay out (its RoPE runs through from_hf_config and
    sam3_vit_positions instead): refused at patch, the model left stock, where it was
    accepted and then failed at every forward."""
    config = transformers.Sam3ViTConfig(hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        patch_size=8, image_size=64, window_size=4,
                                        global_attn_indexes=[1], pretrain_image_size=32)
    torch.manual_seed(0)
    model = transformers.Sam3ViTModel(config).eval()
    assert_refused_unchanged(model, r"model type 'sam3_vit_model' is not reproduced")


def test_a_tensor_alpha_used_otherwise_is_refused():
    """fastpe.hf follows a rotary module's tensor alpha as Mistral Large 4's forward uses
    it (exp(alpha) times every frequency); a module whose forward does not (here Llama's,
    which ignores one) is refused rather than rotated by a guess."""
    model = text_model("llama")
    model.model.rotary_emb.alpha = torch.nn.Parameter(torch.zeros(HEAD_DIM // 2))
    with pytest.raises(ValueError, match=r"holds a tensor alpha that its forward does not "
                                         r"use as exp\(alpha\)"):
        fastpe.hf.patch(model)


def _tower_attention_outputs(model):
    """Every vision attention's output in call order, kept by forward hooks."""
    outputs = []
    for m in model.modules():
        if type(m).__name__.endswith("VisionAttention"):
            m.register_forward_hook(lambda m, a, out: outputs.append(
                (out[0] if isinstance(out, tuple) else out).clone()))
    return outputs


def test_step3p5_tower_rotates_a_batch_of_images_of_one_grid():
    """Step3.5's vision tower (Step3.7's model) runs its images, or an image's local crops,
    as one batch of one grid: q of (images, patches, heads, dim) beside the cos and sin of
    one image's patches, which it broadcasts over the images. Each attention's output is
    its stock one, where the patched tower was accepted and then failed at every forward
    of more than one image."""
    step = pytest.importorskip("transformers.models.step3p7.modeling_step3p7")
    config = step.Step3p7VisionConfig(hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=2,
                                      patch_size=4, image_size=32)
    torch.manual_seed(0)
    stock = _positions_matter(step.Step3p7VisionModel(config).eval())
    model = fastpe.hf.patch(copy.deepcopy(stock))
    want, got = _tower_attention_outputs(stock), _tower_attention_outputs(model)
    for shape in [(1, 3, 16, 24), (3, 3, 16, 24), (2, 3, 8, 4)]:
        pixels = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            stock_out = stock(pixels).last_hidden_state
            out = model(pixels).last_hidden_state
        torch.testing.assert_close(out, stock_out, rtol=0, atol=2e-6)
    assert len(got) == len(want) == 6
    for o, w in zip(got, want, strict=True):
        torch.testing.assert_close(o, w, rtol=0, atol=1e-6 * float(w.abs().max()))


def test_a_tower_of_as_many_patches_as_axes_reads_its_positions_as_patches():
    """A vision tower's rotary module reads its position_ids as (patches, axes)
    (transformers' get_vision_position_ids): PaddleOCR-VL's tower given one image of 1 x 2
    patches, position_ids (2, 2), rotates as stock, where fastpe.hf refused it as
    ambiguous at the forward."""
    config = transformers.PaddleOCRVLConfig(
        text_config=dict(SMALL, head_dim=HEAD_DIM),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, patch_size=4, image_size=32))
    torch.manual_seed(0)
    stock = _positions_matter(
        transformers.PaddleOCRVLForConditionalGeneration(config).eval()).model.visual
    model = fastpe.hf.patch(copy.deepcopy(stock))
    want, got = _tower_attention_outputs(stock), _tower_attention_outputs(model)
    pixels = torch.randn(1, 4, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    for grids in ([[1, 1, 2]], [[1, 2, 1], [1, 1, 2]]):
        n = sum(t * h * w for t, h, w in grids)
        with torch.no_grad():
            stock(pixel_values=pixels[:, :n], grid_thw=torch.tensor(grids))
            model(pixel_values=pixels[:, :n], grid_thw=torch.tensor(grids))
    assert len(got) == len(want) == 2
    for o, w in zip(got, want, strict=True):
        torch.testing.assert_close(o, w, rtol=0, atol=1e-6 * float(w.abs().max()))
