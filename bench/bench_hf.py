"""One decode step of a small random-weight transformers model (Llama, Qwen2, Gemma 2,
Phi-3, GPT-J, DeepSeek-V2 or Llama 4's text model), or one forward of a DeBERTa-v3-style
encoder, stock against fastpe.hf.patch, on one thread:
``python bench/bench_hf.py [--family F] [--rounds N] [--hidden H] [--prompt T]``.

Both models hold the same weights and a KV cache of the same prompt; a step feeds one
token at the next position and is timed alone, then the cache is cropped back, so every
step sees the same state. Each round times the two in a shuffled order (so drift in the
machine's speed hits both alike); the medians and their ratio are printed. Before
timing, the two must give the same greedy tokens. ``--family deberta`` times the
encoder's forward over --prompt tokens instead (heads of 64, log buckets of
DeBERTa-v3: 256 buckets, 512 positions), after checking that the two give the same
hidden states bit for bit: ``--hidden 768 --prompt 512 --rounds 9`` is DeBERTa-v3-base's
shape with 2 of its 12 layers; ``--family deberta_v1`` DeBERTa (v1)-base's.

Needs torch and transformers (the "hf" extra). Not collected by ``pytest bench/``:
it has no test functions.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from typing import Any

# --family: (name, transformers model type, config keywords besides the common ones)
FAMILIES = {
    "llama": ("Llama", "llama", {}),
    "qwen2": ("Qwen2", "qwen2", {}),
    "gemma2": ("Gemma2", "gemma2", {"head_dim": 16}),
    "phi3": ("Phi3", "phi3", {}),
    # (tensor, sin, cos) on q's and k's first 8 features, a sin|cos table
    "gptj": ("GPT-J", "gptj", {"rotary_dim": 8}),
    # latent attention, a complex freqs_cis on the 8 rotary features of q and the shared key
    "deepseek_v2": ("DeepSeek-V2", "deepseek_v2", {
        "q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
        "v_head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1,
        "topk_group": 1, "first_k_dense_replace": 8, "moe_intermediate_size": 32}),
    "llama4": ("Llama 4 text", "llama4_text", {"head_dim": 16, "intermediate_size_mlp": 128,
                                               "num_local_experts": 2}),
    # an encoder forward (encoder_forward), not a decode step
    "deberta": ("DeBERTa-v3", "deberta-v2", {}),
    "deberta_v1": ("DeBERTa", "deberta", {}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=64, help="hidden size (head_dim 16)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=64, help="tokens in the cache")
    parser.add_argument("--family", choices=tuple(FAMILIES), default="llama")
    args = parser.parse_args()

    import torch
    import transformers

    import fastpe
    import fastpe.hf

    torch.set_num_threads(1)
    fastpe.set_num_threads(1)
    if args.family in ("deberta", "deberta_v1"):
        encoder_forward(args, torch, transformers)
        return
    heads = args.hidden // 16
    family, model_type, extra = FAMILIES[args.family]
    config = transformers.AutoConfig.for_model(
        model_type, vocab_size=256, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2), pad_token_id=0, **extra)
    torch.manual_seed(0)
    stock = transformers.AutoModelForCausalLM.from_config(config).eval()
    patched = fastpe.hf.patch(copy.deepcopy(stock))
    prompt = torch.randint(1, 256, (1, args.prompt))

    with torch.no_grad():
        tokens = [m.generate(prompt, max_new_tokens=16, do_sample=False) for m in (stock, patched)]
        if not torch.equal(*tokens):
            raise SystemExit("fastpe.hf: the patched model's greedy tokens differ from stock")
        caches = {}
        for name, model in (("stock", stock), ("fastpe.hf", patched)):
            caches[name] = (model, model(prompt, use_cache=True).cache)
        token = prompt[:, -1:]
        position = torch.tensor([[args.prompt]])
        times: dict[str, list[float]] = {name: [] for name in caches}
        order = list(caches)
        for _ in range(args.rounds):
            random.shuffle(order)
            for name in order:
                model, cache = caches[name]
                start = time.perf_counter()
                model(token, cache=cache, position_ids=position, use_cache=True)
                times[name].append(time.perf_counter() - start)
                cache.crop(-1)  # the step's own token: the next step sees the same cache

    report(f"decode step, {family} hidden {args.hidden}, {args.layers} layers, {heads} heads "
           f"of 16, {args.prompt} cached tokens", args.rounds, times)


def encoder_forward(args: argparse.Namespace, torch: Any, transformers: Any) -> None:
    import fastpe.hf

    heads = max(1, args.hidden // 64)
    sizes = dict(vocab_size=256, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                 num_hidden_layers=args.layers, num_attention_heads=heads,
                 relative_attention=True, max_relative_positions=-1,
                 max_position_embeddings=512, pos_att_type=["p2c", "c2p"])
    torch.manual_seed(0)
    if args.family == "deberta_v1":
        # DeBERTa-base's: no buckets, a span that follows the sequence
        stock = transformers.DebertaModel(transformers.DebertaConfig(
            **sizes, position_biased_input=False)).eval()
    else:
        stock = transformers.DebertaV2Model(transformers.DebertaV2Config(
            **sizes, position_buckets=256, share_att_key=True, position_biased_input=False,
            norm_rel_ebd="layer_norm")).eval()
    patched = fastpe.hf.patch(copy.deepcopy(stock))
    ids = torch.randint(1, 256, (1, args.prompt))
    models = {"stock": stock, "fastpe.hf": patched}
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.no_grad():
        if not torch.equal(*(m(ids).last_hidden_state for m in models.values())):
            raise SystemExit("fastpe.hf: the patched encoder's hidden states differ from stock")
        order = list(models)
        for _ in range(args.rounds):
            random.shuffle(order)
            for name in order:
                start = time.perf_counter()
                models[name](ids)
                times[name].append(time.perf_counter() - start)
    family = FAMILIES[args.family][0]
    report(f"encoder forward, {family}-style hidden {args.hidden}, {args.layers} layers, "
           f"{heads} heads of 64, {args.prompt} tokens", args.rounds, times)


def report(what: str, rounds: int, times: dict[str, list[float]]) -> None:
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"{what}, 1 thread, median of {rounds} shuffled rounds")
    for name, median in medians.items():
        print(f"  {name:10s} {median * 1e6:10.1f} us")
    print(f"  stock / fastpe.hf = {medians['stock'] / medians['fastpe.hf']:.2f}")


if __name__ == "__main__":
    main()
