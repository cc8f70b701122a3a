"""Batched sampling over the rollout's own KV cache (kvcache.KVCache, forward.forward): one
prefill, then one decode step per token. The per-layer pieces around attention can be compiled
(torch.compile) and each step replayed as one CUDA graph (one graph per attention-window bucket,
or a single graph when the split-KV kernel of split_kv.py attends to exactly the written slots),
so the loop is bound by the GPU rather than by Python and kernel launches; on a CPU the step runs
eagerly over exactly the written slots. Each sampled token's logprob is recorded as the sampler
saw it: log softmax(logits / T), before top-p truncation."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from recipeval.reference.forward import EAGER, compiled_kernels, forward, rope_tables, weights_of
from recipeval.reference.kvcache import KVCache, window_for
from recipeval.reference.tokenizer import EOS_ID, PAD_ID

EOS_CHECK_EVERY = 32  # steps between host syncs that ask "has every sample finished?"


@dataclass
class Generation:
    tokens: torch.Tensor  # (B, R) sampled ids, PAD after the first EOS
    logprobs: torch.Tensor  # (B, R) float32, 0 where mask is 0
    mask: torch.Tensor  # (B, R) float32: 1 for sampled tokens up to and including EOS


def sampler_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The distribution the sampler draws from, before top-p: log softmax(logits / T)."""
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns (token ids, their logprobs). Exponential-race sampling
    (argmax p / E, E = -log U ~ Exp(1)) draws from p without a host sync, so it runs inside a
    graph; uniform draws cost a CPU a quarter of exponential_()'s."""
    logp = sampler_logprobs(logits, temperature)
    probs = logp.exp()
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs > top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(outside, 0.0))
    token = (probs / torch.rand_like(probs).log_().neg_()).argmax(dim=-1)
    return token, logp.gather(-1, token.unsqueeze(-1)).squeeze(-1)


class StaticCacheDecoder:
    """Decodes fixed-shape batches (batch_size x prompt_len prompts, up to max_new tokens) with
    one KV cache reused across calls; weights may change between calls (in-place copies keep
    every captured address valid). `window_bucket` 1 attends over exactly the written slots
    (no mask; eager steps), larger buckets keep the step's shapes to a few sizes (CUDA graphs).
    `attention_backend` "triton" runs decode steps' attention as split_kv's kernel over exactly
    the written slots, whatever the bucket (one graph covers every step)."""

    def __init__(
        self,
        model: torch.nn.Module,
        batch_size: int,
        prompt_len: int,
        max_new: int,
        temperature: float,
        top_p: float,
        ignore_eos: bool,
        attention: str = "sdpa",
        cuda_graph: bool = False,
        compile_step: bool = False,
        window_bucket: int = 1,
        attention_backend: str = "torch",
    ) -> None:
        self.weights = weights_of(model)
        self.device = self.weights.embed.device
        self.batch_size, self.prompt_len, self.max_new = batch_size, prompt_len, max_new
        self.temperature, self.top_p, self.ignore_eos = temperature, top_p, ignore_eos
        self.attention = attention
        if cuda_graph and self.device.type != "cuda":
            raise ValueError("--rollout-cuda-graph needs a CUDA device")
        self.cache_len = prompt_len + max_new
        # Slots rounded up to 64: every bucketed window (and its mask) stays a multiple of 16,
        # as fused attention kernels want; the spare slots are always masked.
        self.capacity = window_for(self.cache_len, 64, self.cache_len + 64)
        dtype = self.weights.embed.dtype
        self.cache = KVCache(
            len(self.weights.layers),
            batch_size,
            self.weights.kv_heads,
            self.capacity,
            self.weights.head_dim,
            dtype,
            self.device,
        )
        self.cos, self.sin = rope_tables(self.weights, self.capacity, dtype)
        self.slots = torch.arange(self.capacity, device=self.device)
        self.window_bucket = window_bucket
        self.kernels = compiled_kernels() if compile_step else EAGER
        self.decode_attention = None
        if attention_backend == "triton":
            # Imported here: Triton comes with CUDA builds of torch, not with CPU ones.
            from recipeval.reference.split_kv import decode_attention

            self.decode_attention = decode_attention
            # Steps attend to exactly the written slots: one window, one graph, no mask.
            self.window_bucket = self.capacity
        self._tokens = torch.zeros((batch_size, 1), dtype=torch.long, device=self.device)
        self._position = torch.full((1,), prompt_len, dtype=torch.long, device=self.device)
        self._use_graph = cuda_graph
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._initialised = False

    def refresh_weights(self) -> None:
        """Call after the model's weights changed in place (the fused copies follow)."""
        self.weights.refresh()

    def _step(
        self, tokens: torch.Tensor, position: torch.Tensor, window: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return sample_tokens(
            self._step_logits(tokens, position, window), self.temperature, self.top_p
        )

    def _step_logits(
        self, tokens: torch.Tensor, position: torch.Tensor, window: int
    ) -> torch.Tensor:
        allowed = None
        if self.window_bucket > 1 and self.decode_attention is None:  # junk or zeros past it
            allowed = (self.slots[:window] <= position).unsqueeze(0)
        return forward(
            self.weights,
            self.cache,
            self.cos,
            self.sin,
            tokens,
            position,
            window,
            allowed,
            self.attention,
            self.kernels,
            self.decode_attention,
        )

    def _prefill_logits(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        positions = self.slots[: self.prompt_len]
        causal = positions.unsqueeze(1) >= positions.unsqueeze(0)
        return forward(
            self.weights,
            self.cache,
            self.cos,
            self.sin,
            prompt_ids,
            positions,
            self.prompt_len,
            causal,
            self.attention,
            self.kernels,
        )

    def _prefill(self, prompt_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return sample_tokens(self._prefill_logits(prompt_ids), self.temperature, self.top_p)

    def _window(self, position: int) -> int:
        return window_for(position + 1, self.window_bucket, self.capacity)

    def _initialise(self) -> None:
        """Capture one decode graph per window (the captures write junk into the cache; every
        later prefill and step overwrites a slot before an unmasked query reads it)."""
        if self._use_graph:
            windows = sorted({self._window(p) for p in range(self.prompt_len, self.cache_len)})
            pool = None
            for window in windows:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):  # warm-up: compile, autotune, allocate outside the capture
                        self._step(self._tokens, self._position, window)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = self._step(self._tokens, self._position, window)
                pool = graph.pool()
                self._graphs[window] = (graph, out)
        self._initialised = True

    def _ready(self, prompt_ids: torch.Tensor) -> None:
        if tuple(prompt_ids.shape) != (self.batch_size, self.prompt_len):
            raise ValueError(f"expected prompts of shape {(self.batch_size, self.prompt_len)}")
        if not self._initialised:
            self._initialise()

    def _decode(self, tokens: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample the token after `tokens` (B,), which sit at `position`."""
        window = self._window(position)
        self._tokens.copy_(tokens.unsqueeze(-1))
        self._position.fill_(position)
        if self._graphs:
            graph, out = self._graphs[window]
            graph.replay()
            return out
        return self._step(self._tokens, self._position, window)

    @torch.inference_mode()
    def generate(self, prompt_ids: torch.Tensor) -> Generation:
        self._ready(prompt_ids)
        b, r = self.batch_size, self.max_new
        tokens = torch.full((b, r), PAD_ID, dtype=torch.long, device=self.device)
        logprobs = torch.zeros((b, r), dtype=torch.float32, device=self.device)
        token, logp = self._prefill(prompt_ids.to(self.device))
        tokens[:, 0], logprobs[:, 0] = token, logp
        finished = token == EOS_ID
        steps = 1
        for t in range(1, r):
            if not self.ignore_eos and t % EOS_CHECK_EVERY == 0 and bool(finished.all()):
                break
            token, logp = self._decode(tokens[:, t - 1], self.prompt_len + t - 1)
            tokens[:, t], logprobs[:, t] = token, logp
            if not self.ignore_eos:
                finished |= token == EOS_ID
            steps = t + 1
        return _finish(tokens[:, :steps], logprobs[:, :steps], self.ignore_eos)

    @torch.inference_mode()
    def score(self, prompt_ids: torch.Tensor, response_ids: torch.Tensor) -> torch.Tensor:
        """The sampler's logprobs of given responses (B, R): the same prefill and cached decode
        steps as `generate`, each step fed the given token instead of a sampled one, so another
        run's tokens are scored exactly as this rollout path would have sampled them. Eager
        steps: a captured graph samples, and replays the same kernels anyway (on an H200 a
        run's own tokens re-scored to bitwise the sampled logprobs)."""
        self._ready(prompt_ids)
        if response_ids.shape[0] != self.batch_size or response_ids.shape[1] > self.max_new:
            raise ValueError(
                f"expected at most {self.max_new} response tokens for {self.batch_size} samples"
            )
        given = response_ids.to(self.device)
        logprobs = torch.zeros(given.shape, dtype=torch.float32, device=self.device)
        logits = self._prefill_logits(prompt_ids.to(self.device))
        for t in range(given.shape[1]):
            if t:
                position = self.prompt_len + t - 1
                self._tokens.copy_(given[:, t - 1 : t])
                self._position.fill_(position)
                logits = self._step_logits(self._tokens, self._position, self._window(position))
            logp = sampler_logprobs(logits, self.temperature)
            logprobs[:, t] = logp.gather(-1, given[:, t : t + 1]).squeeze(-1)
        return logprobs


def _finish(tokens: torch.Tensor, logprobs: torch.Tensor, ignore_eos: bool) -> Generation:
    """Cut each sample after its first EOS (kept, as miles trains on it) and trim the batch to
    its longest sample."""
    if ignore_eos:
        mask = torch.ones_like(logprobs)
    else:
        is_eos = (tokens == EOS_ID).int()
        eos_before = is_eos.cumsum(dim=-1) - is_eos  # EOS tokens strictly before each position
        mask = (eos_before == 0).float()
    length = int(mask.sum(dim=-1).max().item())
    mask = mask[:, :length]
    return Generation(
        tokens=tokens[:, :length].masked_fill(mask == 0, PAD_ID),
        logprobs=logprobs[:, :length] * mask,
        mask=mask,
    )
