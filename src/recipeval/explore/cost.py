"""The layout explorer's cost model: predicted seconds of training per rollout (all its
optimizer steps) for a parallel layout, as a sum of named parts, so a ranking says why.

What it counts (first-order, per GPU; every part scales with the tokens of a step):
- compute: 6 x active parameters x tokens (x 4/3 under full recompute) spread over the GPUs
  at a stated fraction (MFU) of the GPU's dense BF16 peak; stretched by the pipeline's load
  imbalance (the slowest stage sets the pace: decoder layers, plus the output layer and loss
  on the last stage) and by the 1F1B bubble, (m + pp - 1) / m for m micro-batches;
- tp: sequence-parallel all-gathers and reduce-scatters of the activations, 4 per layer per
  pass (forward, backward, recompute), at the intra-node bandwidth when the TP group sits in
  one node, else the network's;
- cp: ring attention's exchange of K and V between the context-parallel ranks;
- ep: MoE token dispatch and combine (all-to-all) per MoE layer and pass, the share of peers
  on other nodes at the network's bandwidth;
- pp: activations sent between consecutive stages;
- dp: the gradient reduce-scatter and parameter all-gather of the distributed optimizer,
  counted in full (no overlap assumed).
Bandwidths and peaks are vendor figures per GPU model (below); unknown GPUs take the H100's.
`calibrate` fits a scale for compute and one for communication to measured step times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

BYTES_BF16 = 2


@dataclass(frozen=True)
class Hardware:
    """Per GPU: dense BF16 peak, collective bandwidth inside a node and over the network."""

    peak_flops: float
    intra_node_bytes_s: float
    network_bytes_s: float


# Vendor peaks (dense BF16); intra-node bandwidth as collectives reach it (about half the
# quoted bidirectional link figure); network: one 400 Gb/s NIC per GPU.
HARDWARE: dict[str, Hardware] = {
    "MI355X": Hardware(2.5e15, 400e9, 50e9),
    "MI300X": Hardware(1.3e15, 300e9, 50e9),
    "H200": Hardware(0.99e15, 400e9, 50e9),
    "H100": Hardware(0.99e15, 400e9, 50e9),
    "B200": Hardware(2.25e15, 800e9, 50e9),
}
DEFAULT_HARDWARE = HARDWARE["H100"]
MFU = 0.35  # a stated utilisation of the peak for the compute part


def hardware_for(gpu: str | None) -> Hardware:
    name = (gpu or "").upper()
    for model in sorted(HARDWARE, key=len, reverse=True):
        if model in name:
            return HARDWARE[model]
    return DEFAULT_HARDWARE


@dataclass(frozen=True)
class Workload:
    """What a training step moves and computes, from the recipe (layout-independent)."""

    layers: int
    moe_layers: int
    hidden: int
    active_params: float  # parameters a token passes through (all but the idle experts)
    total_params: float
    expert_params: float
    output_layer_units: float  # the output layer + loss, in decoder layers of compute
    topk: int
    tokens: float  # tokens trained per rollout (every optimizer step of it)
    steps: int  # optimizer steps per rollout
    global_batch: int  # samples per optimizer step
    micro_batch: int  # samples per micro-batch (0: dynamic, by max_tokens_per_gpu)
    max_tokens_per_gpu: int | None
    recompute: bool


@dataclass(frozen=True)
class Placement:
    """A layout on a cluster."""

    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    stage_layers: tuple[int, ...]  # decoder layers per pipeline stage
    gpus: int
    gpus_per_node: int


@dataclass
class Cost:
    parts: dict[str, float] = field(default_factory=dict)  # name -> seconds
    micro_batches: int = 1

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def compute(self) -> float:
        return self.parts.get("compute", 0.0)

    @property
    def communication(self) -> float:
        return self.total - self.compute


def micro_batches(work: Workload, place: Placement) -> int:
    """Micro-batches of one optimizer step on one data-parallel replica."""
    dp = place.gpus // (place.tp * place.pp * place.cp)
    if work.max_tokens_per_gpu:
        per_replica = work.tokens / work.steps / dp
        return max(math.ceil(per_replica / (work.max_tokens_per_gpu * place.cp)), 1)
    micro = work.micro_batch or 1
    return max(work.global_batch // (micro * dp), 1)


def _spread(group: int, gpus_per_node: int, stride: int = 1) -> float:
    """Share of a group's peers on other nodes, for a group of consecutive ranks `stride`
    apart (Megatron orders ranks TP fastest, then CP, EP/DP, PP)."""
    if group <= 1:
        return 0.0
    span = group * stride
    if span <= gpus_per_node:
        return 0.0
    local = max(gpus_per_node // stride, 1)
    return 1.0 - local / group


def _seconds(volume: float, remote_share: float, hw: Hardware) -> float:
    return volume * ((1 - remote_share) / hw.intra_node_bytes_s + remote_share / hw.network_bytes_s)


def predict(work: Workload, place: Placement, hw: Hardware) -> Cost:
    """Seconds of training per rollout (all its optimizer steps), by part."""
    passes = 3 if work.recompute else 2  # forward, backward (+ the recomputed forward)
    m = micro_batches(work, place)
    flops = 6 * work.active_params * work.tokens * (4 / 3 if work.recompute else 1)
    ideal = flops / (place.gpus * hw.peak_flops * MFU)
    loads = list(map(float, place.stage_layers))
    loads[-1] += work.output_layer_units
    imbalance = max(loads) / (sum(loads) / len(loads))
    bubble = (m + place.pp - 1) / m
    dp = place.gpus // (place.tp * place.pp * place.cp)
    tokens_per_gpu_seq = work.tokens / dp / place.cp  # tokens one replica's rank handles
    layers_here = max(place.stage_layers)
    activation = tokens_per_gpu_seq * work.hidden * BYTES_BF16
    parts = {"compute": ideal * imbalance * bubble}
    if place.tp > 1:
        volume = 2 * passes * layers_here * activation * (place.tp - 1) / place.tp
        parts["tp"] = _seconds(volume, _spread(place.tp, place.gpus_per_node), hw)
    if place.cp > 1:
        # Ring attention: each rank receives the K and V of the other CP chunks, per layer and
        # pass (its gradients on the way back).
        volume = passes * layers_here * (place.cp - 1) * 2 * activation / place.tp
        parts["cp"] = _seconds(volume, _spread(place.cp, place.gpus_per_node, place.tp), hw)
    moe_here = work.moe_layers * layers_here / work.layers
    if place.ep > 1 and work.moe_layers:
        volume = (
            2 * passes * moe_here * work.topk * activation / place.tp * (place.ep - 1) / place.ep
        )
        parts["ep"] = _seconds(volume, _spread(place.ep, place.gpus_per_node, place.etp), hw)
    if place.pp > 1:
        stage_span = place.gpus // place.pp
        remote = 1.0 if stage_span >= place.gpus_per_node else 0.0
        parts["pp"] = _seconds(passes * activation / place.tp, remote, hw)
    dense = (work.total_params - work.expert_params) / (place.tp * place.pp)
    experts = work.expert_params / (place.ep * place.etp * place.pp)
    expert_dp = place.gpus // (place.ep * place.etp * place.pp)
    grads = 0.0
    if dp > 1:
        grads += 2 * dense * BYTES_BF16 * (dp - 1) / dp
    if expert_dp > 1:
        grads += 2 * experts * BYTES_BF16 * (expert_dp - 1) / expert_dp
    if grads:
        remote = 1.0 if place.gpus > place.gpus_per_node else 0.0
        parts["dp"] = work.steps * _seconds(grads, remote, hw)
    return Cost(parts, m)


@dataclass(frozen=True)
class Calibration:
    """Scales for the compute and communication parts, fitted to measured step times."""

    compute_scale: float = 1.0
    communication_scale: float = 1.0
    runs: int = 0

    def apply(self, cost: Cost) -> float:
        return self.compute_scale * cost.compute + self.communication_scale * cost.communication

    def describe(self) -> str:
        if not self.runs:
            return "uncalibrated (no measured run of this model in the history)"
        return (
            f"calibrated on {self.runs} measured run(s): compute x{self.compute_scale:.3g}, "
            f"communication x{self.communication_scale:.3g}"
        )


def calibrate(predicted: list[Cost], measured: list[float]) -> Calibration:
    """Non-negative least squares over (compute, communication) on measured step times; with
    one run, or runs that do not tell the parts apart, one common scale."""
    if not predicted:
        return Calibration()
    parts = np.array([[c.compute, c.communication] for c in predicted])
    target = np.asarray(measured, dtype=float)
    if len(predicted) >= 2 and np.linalg.matrix_rank(parts) == 2:
        (compute, comm), _ = nnls(parts, target)
        if compute > 0 and comm > 0:
            return Calibration(float(compute), float(comm), len(predicted))
    totals = parts.sum(axis=1)
    scale = float(np.dot(totals, target) / np.dot(totals, totals))
    return Calibration(scale, scale, len(predicted))


__all__ = [
    "Calibration",
    "Cost",
    "Hardware",
    "Placement",
    "Workload",
    "calibrate",
    "hardware_for",
    "micro_batches",
    "predict",
]
