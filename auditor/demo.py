"""`gpu-audit demo`: a realistic week of a small mixed fleet, written as files and read back through the
same file connectors a site would use, then audited and reported.

Fleet: Slurm cluster "hpc" (gpu-node-01/02/03, 8 x H100 each) and Kubernetes cluster "k8s" (gpu-node-a/b, 8 x
A100 each, and gpu-node-c, 4 x L40S). Planted problems, and nothing else:

- job 1002 spins a kernel: GPU-Util ~99 %, SM activity ~0.03 (util_mirage);
- job 1004 hangs in an all-reduce on 2 GPUs: GPU-Util ~100 %, SM 0, idle power, memory held (hung_collective);
- job 1003 holds 4 GPUs and uses one (idle_gpus);
- the notebook pod holds a GPU idle for days with memory allocated (idle_allocation);
- job 1001 trains on a whole node, stalls for 3 hours (idle_episode) and runs through a 6-hour telemetry gap,
  which must show as unknown, never idle;
- the feature-extract pod streams memory with little compute (low_efficiency, memory-bound);
- reservation team-b-hackathon holds node 02 for a day and nobody comes (idle_reservation);
- job 1030 runs while node 01's exporter is down (unmonitored: never billed as idle);
- GPU 0 of the L40S node gpu-node-c, which nobody holds, latches at 100 % GPU-Util with no memory for a day
  (ghost_busy, for operations; not reserved, not billed);
- the triton service uses < 50 % of its A100s' SMs and 30 GB: an L40S would do (right-sizing, team platform);
- carol's eval-sweep tasks ask for 7 days and run 16 hours (request_hygiene).
- the chat-vllm service serves one request at a time for 48 hours on a memory-bound A100: 30 tokens/s, mean
  concurrency 1.0 (batching_headroom; its cost per million generated tokens in the report and chargeback); its
  prefix cache is on and finds 8 % of the prompt tokens it looks up (a low prompt-cache hit rate, flagged).
- the triton service's TensorRT-LLM batcher runs 1 to 16 requests over the week, 2.33 on average, while its
  tokens/s double with the requests up to 4 running and rise little after: left of its batching knee (4
  running, 400 tokens/s), it leaves 167 tokens/s a pod on the chip.
- Slurm drains gpu-node-02 for 4 hours while eval task 1010_4 runs on it, and gpu-node-a's GPU 1 (under the
  resnet training pod) throws XID 79, later XID 48, and hits a hardware power brake: that time is
  infrastructure-affected (its own column, never idle), and gpu-node-a, with 3 faults, is a lemon
  (lemon_node, for operations).
- training job 1050 on gpu-node-02's GPUs 2-5 fails and is requeued twice: a node failure (12 h), a
  preemption (10 h), then its own failed exit (6 h): 112 GPU-hours lost (goodput; failed_restarts).
- job 1060 trains across gpu-node-02 and gpu-node-03 (4 GPUs each) for 10 hours (hours 110-120): node 03
  computes while node 02's GPUs wait on it, their DRAM and PCIe quiet (straggler, for operations; node 02's
  hours are other host/input wait in "Where the waiting goes": its host shows no cause).
- job 1070 reads its dataset from NFS on gpu-node-03's GPUs 4-7 for 12 hours (hours 20-32), the only work on
  that node then: GPUs, DRAM and PCIe quiet, GPU-Util pulsing at ~35 %, while node_exporter shows a fifth of
  the node's cores in I/O wait and 240 MB/s of NFS reads (input/storage wait in "Where the waiting goes";
  low_efficiency). Every node writes host telemetry all week (node_exporter's figures, `*-nodes.csv`).
- gpu-node-03's InfiniBand port mlx5_2/1 waits to send 30 % of the time while job 1060 runs (hours 110-120;
  1 % otherwise, as every other port), the node moving 1 GB/s each way: the straggler finding names the port,
  and "Congested ports" ranks it first with 8 GPUs x 10 h x 0.30 = 24 GPU-hours held up (`hpc-ports.csv`).
- Fabric fit: every hpc node and the k8s node gpu-node-b report an InfiniBand port (quiet, 10 MB/s each way):
  the inference servers triton-0 (2 GPUs, all week: 336 GPU-hours) and chat-vllm on gpu-node-b are single-node
  work on the fabric, as are the hpc single-node jobs; job 1060 used the fabric and is not listed.

Kubernetes site of 2026 "k8s-2026" (issue 42; GPU Operator + kube-prometheus-stack): node h100-node-1, 4 x H100,
its telemetry as that site's Prometheus stores it, read from a saved `/federate` answer (`k8s-2026-federate.prom`,
the `scrape` connector): dcgm-exporter scraped through the Operator's ServiceMonitor with `honorLabels: false`,
so every series carries the exporter's own `pod` (gpu-operator/nvidia-dcgm-exporter-*) and the workload's
labels as `exported_pod`/`exported_namespace`/`exported_container`. Its pods are attributed by those labels:

- the sft-worker pod trains on 2 GPUs for 48 hours (work, attributed to it, not to the exporter); it holds them
  through a DRA claim (Kubernetes 1.34 `resource.k8s.io/v1`: the GPUs' UUIDs, as the kubernetes connector reads
  them from the claim's ResourceSlice devices, so it is tied to its telemetry GPUs by UUID) and ran in Kueue's
  ClusterQueue `ml-cq` (nominal quota 4 GPUs): 0.6 of the 4 in use over the week (idle_quota for the queue);
- dana's notebook pod holds a GPU idle for 72 hours (idle_allocation: found only because its GPU's series are
  read by `exported_pod`; taken by `pod`, every hour of the site would be unknown). Kueue admitted it into
  ml-cq too, so while it idles a Kueue Workload (PyTorchJob llm-sft-2, 4 GPUs) waits 40 hours for admission in
  that queue and is deleted unadmitted: 40 idle GPU-hours while GPU jobs waited (idle_while_queued).

The site runs the GPU Operator's stock counters (dcgm-exporter's default: GR engine, Tensor, DRAM and GPU-Util on,
SM activity off), so it is judged on the second evidence tier (docs/definitions.md "Evidence tiers"): the
sft-worker busy by counters, dana's notebook idle by counters, and an all-reduce that hangs on h100-node-1's GPU 3
for 12 hours (GR engine busy, Tensor and DRAM at zero: an engine spin, never verified work). Its MIG node
a100-mig-node-1 (one A100 cut into 1g.5gb slices) reports the counters per instance and no GPU-Util: an
embedding server's slice is busy by counters all week, a notebook's slice idle by counters for 96 hours
(idle_allocation), each judged on its own instance.

Every capability a site can switch on is on: prices per model, teams, email, and energy with a grid carbon
intensity per cluster (so the report shows kg CO2 beside kWh).
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from auditor import owned
from auditor.timeutil import floor_to, utcnow

DAY = 86400
BUCKET = 300
#: Field -> the dcgm-exporter metric name the demo writes it under (GPU-Util 0-100, profiling fields 0-1).
TELEMETRY_FIELDS = {"gpu_util": "DCGM_FI_DEV_GPU_UTIL", "sm_active": "DCGM_FI_PROF_SM_ACTIVE",
                    "tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
                    "fb_used_mib": "DCGM_FI_DEV_FB_USED", "power_w": "DCGM_FI_DEV_POWER_USAGE"}


@dataclass
class Profile:
    """How a GPU behaves while a workload runs on it (values before noise)."""

    sm: float
    util: float
    tensor: float = 0.0
    dram: float = 0.0
    fb: float = 0.0
    power: float = 70.0
    daily: bool = False  # inference: busier by day
    pcie: float | None = None  # PCIe TX bytes/s, written only when set (DCGM_FI_PROF_PCIE_TX_BYTES)

    def at(self, ts: int, rng: random.Random) -> dict[str, float]:
        k = 1.0
        if self.daily:
            hour = (ts % DAY) / 3600
            k = 0.45 + 0.55 * max(0.0, math.sin(math.pi * (hour - 6) / 14)) if 6 <= hour <= 20 else 0.45
        def noisy(v: float, hi: float = 1.0) -> float:
            return min(hi, max(0.0, v * k * (1 + rng.uniform(-0.05, 0.05))))
        return {"gpu_util": min(100.0, noisy(self.util, 1.0) * 100), "sm_active": noisy(self.sm),
                "tensor_active": noisy(self.tensor), "dram_active": noisy(self.dram),
                "fb_used_mib": self.fb, "power_w": 60 + (self.power - 60) * k}


WORKING = Profile(sm=0.78, util=1.0, tensor=0.55, dram=0.45, fb=61000, power=520)
SPIN = Profile(sm=0.03, util=0.99, tensor=0.0, dram=0.01, fb=3000, power=210)  # above idle: not hung
HUNG = Profile(sm=0.0, util=1.0, tensor=0.0, dram=0.0, fb=30000, power=75)  # a hung NCCL collective
HELD_IDLE = Profile(sm=0.0, util=0.0, tensor=0.0, dram=0.0, fb=20480, power=62)
INFERENCE = Profile(sm=0.7, util=0.95, tensor=0.35, dram=0.3, fb=30000, power=300, daily=True)
FREE = Profile(sm=0.0, util=0.0, fb=0, power=55)
MEMORY_BOUND = Profile(sm=0.15, util=0.9, tensor=0.02, dram=0.62, fb=70000, power=280)
#: a vLLM server decoding one request at a time: weights streamed from memory per token (DRAM high), SM ~30 %
#: (not low_efficiency), 72 GB of KV cache preallocated (vLLM's default 90 %: no smaller model fits)
BATCH_OF_ONE = Profile(sm=0.3, util=0.97, tensor=0.05, dram=0.55, fb=72000, power=260)
#: a lockstep rank waiting on a straggler: SM, DRAM and PCIe low (PCIe bytes/s; None: the field is not written)
WAITING_RANK = Profile(sm=0.12, util=0.95, tensor=0.01, dram=0.05, fb=52000, power=180, pcie=2e7)
STRAGGLER = Profile(sm=0.85, util=1.0, tensor=0.6, dram=0.35, fb=52000, power=560, pcie=2e7)
#: a rank whose data loader waits on NFS: SM ~8 % (low, not idle), DRAM and PCIe quiet, GPU-Util pulsing ~35 %
STORAGE_STARVED = Profile(sm=0.08, util=0.35, tensor=0.01, dram=0.04, fb=38000, power=150, pcie=5e7)


@dataclass
class Workload:
    cluster: str
    id: str
    name: str
    user: str
    account: str
    node: str
    gpus: list[int]
    start_h: float
    hours: float
    profile: Profile
    per_gpu: dict[int, Profile] = field(default_factory=dict)
    source: str = "slurm"
    indices_known: bool = True
    labels: dict[str, str] = field(default_factory=dict)
    owner: str = ""
    idle_spans: list[tuple[float, float]] = field(default_factory=list)  # hours into the week, GPUs held idle
    state: str = "COMPLETED"  # the scheduler's end state
    #: GPUs on further nodes (a multi-node job) and a profile per node (default: ``profile``)
    more_nodes: dict[str, list[int]] = field(default_factory=dict)
    per_node: dict[str, Profile] = field(default_factory=dict)
    mig: str = ""  # the MIG instance (GPU_I_ID) it holds a slice of, "" = whole GPUs
    partition: str = ""  # the queue (Kubernetes: a Kueue ClusterQueue) it ran in
    dra: bool = False  # GPUs allocated through DRA: known by UUID (the claim's devices), not by index or count

    def profile_at(self, gpu: int, hour: float, node: str = "") -> Profile:
        if any(a <= hour < b for a, b in self.idle_spans):
            return HELD_IDLE
        return self.per_gpu.get(gpu, self.per_node.get(node, self.profile))

    def placement(self) -> dict[str, list[int]]:
        """node -> GPU indices the workload holds there."""
        return {self.node: self.gpus, **self.more_nodes}


def fleet() -> list[Workload]:
    """The planted week (hours from the start of the week)."""
    w = [
        Workload("hpc", "1001", "llama-pretrain", "alice", "team-a", "gpu-node-01", list(range(8)), 2, 140,
                 WORKING, idle_spans=[(100.0, 103.0)]),
        Workload("hpc", "1030", "debug-shell", "bob", "team-b", "gpu-node-01", [0], 150, 10, WORKING),
        Workload("hpc", "1002", "spin-wait", "bob", "team-b", "gpu-node-02", [0, 1], 10, 48, SPIN),
        Workload("hpc", "1004", "allreduce-hang", "dave", "team-a", "gpu-node-02", [0, 1], 70, 12, HUNG),
        Workload("hpc", "1003", "ddp-debug", "carol", "team-a", "gpu-node-02", [2, 3, 4, 5], 30, 36, HELD_IDLE,
                 per_gpu={2: WORKING}),
        Workload("k8s", "5b0c-notebook", "notebook-alice-6d5f8b7c9-tx2lq", "alice", "research", "gpu-node-a",
                 [0], 24, 120, HELD_IDLE, source="kubernetes", indices_known=False,
                 labels={"app": "notebook", "team": "research"}, owner="Deployment/notebook-alice"),
        Workload("k8s", "7e1f-triton", "triton-0", "", "inference", "gpu-node-b", [0, 1], 0, 168, INFERENCE,
                 source="kubernetes", indices_known=False, labels={"app": "triton"}, owner="StatefulSet/triton"),
        Workload("k8s", "9a2d-resnet", "resnet-train-q9d4m", "", "ml-train", "gpu-node-a", [1, 2, 3, 4], 50, 30,
                 WORKING, source="kubernetes", indices_known=False, labels={"app": "resnet"},
                 owner="Job/resnet-train"),
        Workload("k8s", "c3e8-features", "feature-extract-7k2xq", "", "ml-train", "gpu-node-b", [2, 3], 60, 40,
                 MEMORY_BOUND, source="kubernetes", indices_known=False, labels={"app": "features"},
                 owner="Job/feature-extract"),
        Workload("k8s", "4f6a-chat-vllm", "chat-vllm-5f7d9-x2k4p", "", "inference", "gpu-node-b", [4], 24, 48,
                 BATCH_OF_ONE, source="kubernetes", indices_known=False, labels={"app": "chat-vllm"},
                 owner="Deployment/chat-vllm"),
    ]
    # the Kubernetes site of 2026 (SITE26): its pods, attributed through Operator-relabelled labels
    # the sft worker holds its GPUs through a DRA claim (their UUIDs) and ran in Kueue's ClusterQueue ml-cq
    w.append(Workload(SITE26, "8d1e-sft", "llm-sft-worker-0", "", "ml-train", "h100-node-1", [0, 1], 10, 48,
                      WORKING, source="kubernetes", indices_known=False,
                      labels={"app": "llm-sft", "kueue.x-k8s.io/queue-name": "ml-train"},
                      owner="PyTorchJob/llm-sft", partition=SITE26_QUEUE[0], dra=True))
    # dana's notebook is admitted by Kueue too (its StatefulSet labelled with LocalQueue research -> ml-cq)
    w.append(Workload(SITE26, "2b7a-notebook", "dana-notebook-0", "dana", "research", "h100-node-1", [2], 30, 72,
                      HELD_IDLE, source="kubernetes", indices_known=False,
                      labels={"app": "notebook", "kueue.x-k8s.io/queue-name": "research"},
                      owner="StatefulSet/dana-notebook", partition=SITE26_QUEUE[0]))
    # its stock counters: an all-reduce hung on GPU 3 (GR engine busy, Tensor and DRAM at zero: an engine spin)
    w.append(Workload(SITE26, "5e3b-allreduce", "ddp-eval-0", "", "ml-train", "h100-node-1", [3], 80, 12, HUNG,
                      source="kubernetes", indices_known=False, labels={"app": "ddp-eval"}, owner="Job/ddp-eval"))
    # its MIG node: pods on 1g.5gb slices of one A100, each slice's series labelled with its pod (GPU_I_ID)
    w.append(Workload(SITE26, "61c0-embed", "embed-server-0", "", "inference", SITE26_MIG_NODE, [0], 0, 168,
                      INFERENCE, source="kubernetes", indices_known=False, labels={"app": "embed"},
                      owner="Deployment/embed-server", mig="7"))
    w.append(Workload(SITE26, "93fa-notebook", "erin-notebook-0", "erin", "research", SITE26_MIG_NODE, [0], 40, 96,
                      HELD_IDLE, source="kubernetes", indices_known=False, labels={"app": "notebook"},
                      owner="StatefulSet/erin-notebook", mig="8"))
    # a two-node job whose node 03 holds node 02 up (hours 110-120: after 1050's last run and the drain, before
    # the reservation)
    w.append(Workload("hpc", "1060", "llama-2node", "erin", "team-a", "gpu-node-02", [0, 1, 2, 3], 110, 10,
                      WAITING_RANK, more_nodes={"gpu-node-03": [0, 1, 2, 3]}, per_node={"gpu-node-03": STRAGGLER}))
    # a job its storage starves (issue 36, the host side): alone on gpu-node-03 for its hours (STORAGE_WAIT)
    w.append(Workload("hpc", "1070", "vit-dataload", "frank", "team-a", "gpu-node-03", [4, 5, 6, 7], 20, 12,
                      STORAGE_STARVED))
    for i in range(6):  # back-to-back evaluation array tasks on node-02 GPUs 6-7
        w.append(Workload("hpc", f"1010_{i}", "eval-sweep", "carol", "team-b", "gpu-node-02", [6, 7],
                          12 + i * 20, 16, WORKING))
    for start_h, hours, state in REQUEUED_RUNS:  # Slurm resets the submit time on a requeue: 3 runs of one id
        w.append(Workload("hpc", "1050", "llama-finetune", "erin", "team-a", "gpu-node-02", [2, 3, 4, 5], start_h,
                          hours, WORKING, state=state))
    return w


#: Job 1050's runs (from hour, hours, end state): a node failure, a preemption, then its own failed exit;
#: clear of 1003 (GPUs 2-5 until hour 66), of the drain (hours 95-99) and of the reservation (from 140).
REQUEUED_RUNS = ((70.0, 12.0, "NODE_FAIL"), (84.0, 10.0, "PREEMPTED"), (100.0, 6.0, "FAILED"))


#: A drained node: cluster, node, from hour, to hour, the admin's reason (Slurm's node event).
DRAIN = ("hpc", "gpu-node-02", 95.0, 99.0, "GPU 3 fell off the bus (XID 79), waiting for a reboot")
#: GPU faults in telemetry: (cluster, node, GPU) -> [(from hour, DCGM_FI_DEV_XID_ERRORS value)] (the gauge keeps
#: the last XID: a change to a new non-zero value is a fault) and the hour of a HW power brake (0x80).
XIDS = {("k8s", "gpu-node-a", 1): [(0.0, 0), (55.0, 79), (65.0, 48)]}
POWER_BRAKE = {("k8s", "gpu-node-a", 1): 75.0}
#: Telemetry gaps: cluster, node, from hour, to hour (the exporter was down).
GAPS = [("hpc", "gpu-node-01", 60.0, 66.0), ("hpc", "gpu-node-01", 148.0, 168.0)]
#: An advance reservation nobody used: name, node, from hour, to hour.
RESERVATION = ("team-b-hackathon", "gpu-node-02", 140.0, 164.0)
NODES = {"hpc": ["gpu-node-01", "gpu-node-02", "gpu-node-03"], "k8s": ["gpu-node-a", "gpu-node-b", "gpu-node-c"]}


# -- issue 19 cases: a ghost on a GPU nobody holds, a smaller model in the inventory, request hygiene --------
#: The Kubernetes site of 2026 (issue 42): node -> (GPUs, model); its telemetry is what its Prometheus stores
#: (scraped through the Prometheus Operator, honorLabels false), saved from /federate; allocations are pods.
SITE26 = "k8s-2026"
SITE26_NODES = {"h100-node-1": (4, "NVIDIA H100 80GB HBM3"), "a100-mig-node-1": (1, "NVIDIA A100-SXM4-40GB")}
#: its MIG node, the profile of its slices and their share of the GPU (an A100 40GB: seven 1g.5gb slices)
SITE26_MIG_NODE, SITE26_MIG_PROFILE, SITE26_MIG_SHARE = "a100-mig-node-1", "1g.5gb", 1 / 7
#: the GPU Operator's dcgm-exporter defaults (NVIDIA/dcgm-exporter etc/default-counters.csv): GR engine, Tensor,
#: DRAM and GPU-Util on, SM activity off; a MIG instance has no GPU-Util (NVML reports none in MIG mode), and
#: board power is the whole GPU's
STOCK_FIELDS = {"gpu_util": "DCGM_FI_DEV_GPU_UTIL", "gr_engine": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                "tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
                "fb_used_mib": "DCGM_FI_DEV_FB_USED", "power_w": "DCGM_FI_DEV_POWER_USAGE"}
MIG_FIELDS = ("gr_engine", "tensor_active", "dram_active", "fb_used_mib")
#: node -> the GPU Operator's dcgm-exporter pod on it (namespace gpu-operator, a DaemonSet) and its address
SITE26_EXPORTERS = {"h100-node-1": ("nvidia-dcgm-exporter-x7k2p", "10.42.1.17:9400"),
                    "a100-mig-node-1": ("nvidia-dcgm-exporter-m4q8z", "10.42.2.9:9400")}
#: its Kueue ClusterQueue (name, nominal quota of nvidia.com/gpu): the sft worker's queue; 2 GPUs for 48 h of the
#: week's 168 use 0.6 of its 4 on average: idle_quota
SITE26_QUEUE = ("ml-cq", 4)
#: a Kueue Workload waiting for admission in ml-cq (id, name, namespace, GPUs, from hour, to hour): the PyTorchJob
#: llm-sft-2 asks 4 GPUs while dana's idle notebook holds 1 of the queue's 4; deleted unadmitted at hour 100
#: (state Finished, as the kubernetes connector reads a Workload that ended unadmitted)
SITE26_WAIT = ("7c2e-wl-llm-sft-2", "pytorchjob-llm-sft-2-7c2e1", "ml-train", 4, 60.0, 100.0)


def site26_uuid(node: str, gpu: int) -> str:
    """The UUID of a 2026-site GPU, as its telemetry's UUID label and its ResourceSlice give it."""
    return f"GPU-{SITE26}-{node}-{gpu}"


def fleet_line() -> str:
    """The demo's fleet in one line (the first line `gpu-audit demo` prints)."""
    per_model: dict[str, list[int]] = {}
    for node, (gpus, model) in SITE26_NODES.items():
        name = model.split()[1].split("-")[0] + (f" in MIG {SITE26_MIG_PROFILE} slices" if node == SITE26_MIG_NODE
                                                 else "")
        per_model.setdefault(name, []).append(gpus)
    site = ", ".join(f"{len(g)} node{'s' if len(g) > 1 else ''} x {g[0]} {m}" for m, g in per_model.items())
    return f"3 Slurm + 2 Kubernetes nodes x 8 GPUs, 1 Kubernetes node x 4 L40S, and a Kubernetes site of 2026 " \
           f"({SITE26}: {site})"


#: The k8s cluster's L40S node: its GPU count and model (the others: 8 of the cluster's model).
SMALL_NODE = ("k8s", "gpu-node-c", 4, "NVIDIA L40S")
#: A GPU nobody holds reading 100 % GPU-Util with no memory: cluster, node, GPU, from hour, to hour.
GHOST_GPU = ("k8s", "gpu-node-c", 0, 30.0, 54.0)
GHOST = Profile(sm=0.0, util=1.0, fb=0, power=80)


def node_gpus(cluster: str, node: str, model: str) -> tuple[int, str]:
    """GPU count and telemetry model name of a demo node."""
    c, n, gpus, small = SMALL_NODE
    return (gpus, small) if (cluster, node) == (c, n) else (8, model)


def time_limit_s(w: Workload) -> int:
    """The requested limit: the runtime rounded up to whole days, except carol's eval sweep, which asks for
    7 days and runs 16 hours (request_hygiene)."""
    days = 7 if w.id.startswith("1010_") else math.ceil(w.hours / 24)
    return int(days * DAY)


def ghost_at(cluster: str, node: str, gpu: int, hour: float) -> bool:
    c, n, g, a, b = GHOST_GPU
    return (cluster, node, gpu) == (c, n, g) and a <= hour < b


#: A GPU job that waited in partition gpu (id, user, account, GPUs, from hour, to hour) while ddp-debug held
#: three GPUs idle on gpu-node-02 and nothing else of the partition was idle: idle_while_queued.
WAIT = ("1040", "bob", "team-b", 4, 58.0, 64.0)
#: GPU quotas (account GrpTRES gres/gpu): team-b uses ~1.2 of 8 (idle_quota); team-a ~6.7 of 10 (fine).
QUOTAS = {"team-a": 10, "team-b": 8}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_allocations(out: Path, t0: int) -> list[Path]:
    """Slurm jobs as CSV, Kubernetes pods as JSON (both documented file formats)."""
    paths = []
    slurm = out / "hpc-allocations.csv"
    with slurm.open("w", newline="", encoding="utf-8") as f:
        wr = csv.writer(f)
        wr.writerow(["id", "name", "user", "account", "partition", "state", "start", "end", "gpus", "model",
                     "source", "time_limit_s"])
        for w in fleet():
            if w.cluster != "hpc":
                continue
            end = t0 + (w.start_h + w.hours) * 3600
            gpus = ";".join(f"{n}:{','.join(map(str, g))}" if w.indices_known else f"{n}:*{len(g)}"
                            for n, g in w.placement().items())
            wr.writerow([w.id, w.name, w.user, w.account, "gpu", w.state, _iso(t0 + w.start_h * 3600),
                         _iso(end), gpus, "h100", "slurm", time_limit_s(w)])
    paths.append(slurm)
    extra = out / "hpc-reservations.json"
    name, node, a, b = RESERVATION
    wid, wuser, wacct, wgpus, wa, wb = WAIT
    extra.write_text(json.dumps(
        [{"type": "reservation", "name": name, "nodes": [node], "gpu_count": 8, "accounts": ["team-b"],
          "start": _iso(t0 + a * 3600), "end": _iso(t0 + b * 3600), "flags": ["MAINT"]}]
        + [{"type": "inventory", "node": n, "gpus": 8, "model": "h100"} for n in NODES["hpc"]]
        + [{"type": "wait", "id": wid, "name": "train-big", "user": wuser, "account": wacct, "partition": "gpu",
            "gpus": wgpus, "eligible": _iso(t0 + wa * 3600), "end": _iso(t0 + wb * 3600), "state": "COMPLETED"}]
        + [{"type": "quota", "kind": "account", "name": k, "gpus": n} for k, n in QUOTAS.items()]
        + [{"type": "node_event", "node": DRAIN[1], "kind": "drain", "start": _iso(t0 + DRAIN[2] * 3600),
            "end": _iso(t0 + DRAIN[3] * 3600), "reason": DRAIN[4]}], indent=1),
        encoding="utf-8")
    paths.append(extra)
    pods = out / "k8s-allocations.json"
    items = []
    for w in fleet():
        if w.cluster != "k8s":
            continue
        items.append({"id": w.id, "name": w.name, "user": w.user, "account": w.account, "state": "Succeeded",
                      "source": "kubernetes", "start": _iso(t0 + w.start_h * 3600),
                      "end": _iso(t0 + (w.start_h + w.hours) * 3600), "owner": w.owner, "labels": w.labels,
                      "gpus": [{"node": w.node, "model": "NVIDIA-A100-SXM4-80GB"} for _ in w.gpus]})
    items += [{"type": "inventory", "node": n, "gpus": node_gpus("k8s", n, "")[0],
               "model": node_gpus("k8s", n, "NVIDIA-A100-SXM4-80GB")[1].replace(" ", "-")} for n in NODES["k8s"]]
    pods.write_text(json.dumps(items, indent=1), encoding="utf-8")
    paths.append(pods)
    site = out / f"{SITE26}-allocations.json"
    items = [{"id": w.id, "name": w.name, "user": w.user, "account": w.account, "state": "Succeeded",
              "source": "kubernetes", "start": _iso(t0 + w.start_h * 3600), "partition": w.partition,
              "end": _iso(t0 + (w.start_h + w.hours) * 3600), "owner": w.owner, "labels": w.labels,
              "gpus": [{"node": w.node, "model": SITE26_NODES[w.node][1].replace(" ", "-"),
                        **({"mig_profile": SITE26_MIG_PROFILE, "share": SITE26_MIG_SHARE} if w.mig else {}),
                        **({"uuid": site26_uuid(w.node, g)} if w.dra else {})} for g in w.gpus]}
             for w in fleet() if w.cluster == SITE26]
    items.append({"type": "quota", "kind": "queue", "name": SITE26_QUEUE[0], "gpus": SITE26_QUEUE[1]})
    wid, wname, wns, wgpus, wa, wb = SITE26_WAIT
    items.append({"type": "wait", "source": "kubernetes", "id": wid, "name": wname, "account": wns,
                  "partition": SITE26_QUEUE[0], "gpus": wgpus, "eligible": _iso(t0 + wa * 3600),
                  "end": _iso(t0 + wb * 3600), "state": "Finished"})
    items += [{"type": "inventory", "node": n, "gpus": g, "model": m.replace(" ", "-")}
              for n, (g, m) in SITE26_NODES.items()]
    site.write_text(json.dumps(items, indent=1), encoding="utf-8")
    paths.append(site)
    return paths


#: What the demo's exporter exports: "dcgm" (profiling fields on) or "util-only" (a site whose exporter has
#: GPU-Util, memory and power only, as dcgm-exporter's default, nvidia_gpu_exporter or jobstats give)
TELEMETRY_KINDS = ("dcgm", "util-only")
UTIL_ONLY_FIELDS = ("gpu_util", "fb_used_mib", "power_w")


def _telemetry_rows(cluster: str, t0: int, days: int, rng: random.Random,
                    telemetry: str = "dcgm") -> Iterator[list[str]]:
    placed: dict[tuple[str, int], list[Workload]] = {}
    for w in fleet():
        if w.cluster == cluster:
            for n, gs in w.placement().items():
                for g in gs:
                    placed.setdefault((n, g), []).append(w)
    model = "NVIDIA H100 80GB HBM3" if cluster == "hpc" else "NVIDIA A100-SXM4-80GB"
    for b in range(days * DAY // BUCKET):
        ts = t0 + b * BUCKET
        hour = b * BUCKET / 3600
        for node in NODES[cluster]:
            if any((cluster, node) == (c, n) and a <= hour < b for c, n, a, b in GAPS):
                continue
            gpus, gpu_model = node_gpus(cluster, node, model)
            for g in range(gpus):
                running = [w for w in placed.get((node, g), [])
                           if w.start_h <= hour < w.start_h + w.hours]
                w = running[0] if running else None
                prof = w.profile_at(g, hour, node) if w else (GHOST if ghost_at(cluster, node, g, hour) else FREE)
                values = prof.at(ts - t0, rng)  # the daily cycle from the week's start: the same week at any hour
                uuid = f"GPU-{cluster}-{node}-{g}"
                pod = ns = ""
                if w and w.source == "kubernetes":
                    pod, ns = w.name, w.account
                # one sample per bucket at its start: it covers the bucket until the next (docs/definitions.md)
                sample_ts = _iso(ts)
                for fld, metric in TELEMETRY_FIELDS.items():
                    if telemetry == "util-only" and fld not in UTIL_ONLY_FIELDS:
                        continue
                    yield [sample_ts, node, str(g), uuid, metric, f"{values[fld]:.4f}", gpu_model, pod, ns]
                if prof.pcie is not None and telemetry != "util-only":
                    yield [sample_ts, node, str(g), uuid, "DCGM_FI_PROF_PCIE_TX_BYTES", f"{prof.pcie:.0f}", gpu_model,
                           pod, ns]
                yield from _fault_rows(cluster, node, g, hour, [sample_ts, node, str(g), uuid], [gpu_model, pod, ns])


def _fault_rows(cluster: str, node: str, g: int, hour: float, head: list[str], tail: list[str]
                ) -> Iterator[list[str]]:
    """The planted GPU's fault fields: the last XID, and the clock-event reasons (0x80: HW power brake)."""
    xids = XIDS.get((cluster, node, g))
    if xids:
        xid = [v for h, v in xids if h <= hour][-1]
        yield [*head, "DCGM_FI_DEV_XID_ERRORS", str(xid), *tail]
    brake = POWER_BRAKE.get((cluster, node, g))
    if brake is not None:
        yield [*head, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "128" if brake <= hour < brake + BUCKET / 3600 else "0",
               *tail]


#: The planted inference server's metrics per bucket: workload id -> (engine, model, tokens/s, requests running)
INFERENCE_METRICS = {"4f6a-chat-vllm": ("vllm", "meta-llama/Llama-3.1-8B-Instruct", 30.0, 1.0)}
#: Its prefix cache (vLLM's prefix_cache_queries/hits counters, per second): caching on, 2,000 prompt tokens
#: looked up a second and 160 found, a hit rate of 8 % (below LOW_CACHE_HIT_RATE: flagged)
PREFIX_CACHE = {"4f6a-chat-vllm": (2000.0, 160.0)}
#: The triton service's TensorRT-LLM batcher (issue 48, the batching knee): requests running per bucket in a
#: cycle of 21 buckets (15 at 1, 3 at 2, one each at 4, 8, 16: mean 49 / 21 = 2.33) and its tokens/s at each:
#: twice the requests, twice the tokens up to 4, then 40 tokens/s per added request (the knee at 4 running)
KNEE_CYCLE = (1,) * 15 + (2,) * 3 + (4, 8, 16)
KNEE_CURVE = {1: 100.0, 2: 200.0, 4: 400.0, 8: 560.0, 16: 600.0}
KNEE_SERVICE = ("7e1f-triton", "triton", "chat_trtllm")


def write_inference(out: Path, t0: int) -> Path:
    """The inference server's per-bucket figures as the inference connector's CSV form (docs/inference.md)."""
    p = out / "k8s-inference.csv"
    with p.open("w", newline="", encoding="utf-8") as f:
        wr = csv.writer(f)
        wr.writerow(["start", "engine", "namespace", "pod", "generated_tokens", "running", "waiting", "batch",
                     "model", "cache_queries", "cache_hits"])
        for w in fleet():
            if w.id not in INFERENCE_METRICS:
                continue
            engine, model, rate, running = INFERENCE_METRICS[w.id]
            queries, hits = PREFIX_CACHE.get(w.id, (None, None))
            cache = [f"{queries * BUCKET:g}", f"{hits * BUCKET:g}"] if queries is not None else ["", ""]
            first = int(t0 + w.start_h * 3600)
            for ts in range(first, int(first + w.hours * 3600), BUCKET):
                wr.writerow([_iso(ts), engine, w.account, w.name, f"{rate * BUCKET:g}", f"{running:g}", "0", "",
                             model, *cache])
        for w in fleet():
            if w.id != KNEE_SERVICE[0]:
                continue
            first = int(t0 + w.start_h * 3600)
            for i, ts in enumerate(range(first, int(first + w.hours * 3600), BUCKET)):
                c = KNEE_CYCLE[i % len(KNEE_CYCLE)]
                wr.writerow([_iso(ts), KNEE_SERVICE[1], w.account, w.name, f"{KNEE_CURVE[c] * BUCKET:g}", f"{c:g}",
                             "0", f"{c:g}", KNEE_SERVICE[2], "", ""])
    return p


# -- host telemetry (issue 36): what node_exporter reports of every node, all week ------------------------------
#: The job whose node's host shows it waiting on storage, and what the host shows while it runs (per-second
#: means): a fifth of the 64 cores in I/O wait, 240 MB/s and 3,200 requests/s of NFS reads, local disk not busy
STORAGE_WAIT = ("hpc", "1070")
STORAGE_HOST = {"cpu_iowait": 12.8, "nfs_read_bps": 2.4e8, "nfs_ops": 3200.0, "disk_busy": 0.35}
#: Columns of the node files (docs/node-telemetry.md "From files"); Lustre is not reported (NULL: not measured)
NODE_COLUMNS = ("cpus", "cpu_busy", "cpu_iowait", "cpu_pegged", "disk_read_bps", "disk_write_bps", "disk_busy",
                "ib_rx_bps", "ib_tx_bps", "nfs_read_bps", "nfs_ops")


#: The k8s node with an InfiniBand port (a fabric node, its port quiet): its inference servers (triton-0,
#: chat-vllm) are single-node work on the fabric (fabric fit)
FABRIC_K8S_NODE = ("k8s", "gpu-node-b")
#: The two-node job's straggler node moves 1 GB/s each way over InfiniBand while the job runs: the job uses the
#: fabric (never "fabric quiet"); its GPUs compute, so its host's traffic classifies nothing
LOCKSTEP_IB = ("hpc", "1060", "gpu-node-03", 1e9)


def _host(cluster: str, node: str, hour: float, running: int, storage: bool,
          lockstep: bool = False) -> dict[str, float | None]:
    """One node's host in one bucket: quiet but for ~1.5 cores per GPU at work, and the storage job's wait.
    The hpc nodes and FABRIC_K8S_NODE have InfiniBand (the other k8s nodes' IB columns are empty: not
    measured); ``lockstep``: LOCKSTEP_IB's node while its job runs."""
    fabric = cluster == "hpc" or (cluster, node) == FABRIC_K8S_NODE
    ib = LOCKSTEP_IB[3] if lockstep else 1e7 if fabric else None
    v: dict[str, float | None] = {
        "cpus": 32.0 if (cluster, node) == SMALL_NODE[:2] else 64.0, "cpu_busy": 1.0 + 1.5 * running,
        "cpu_iowait": 0.2, "cpu_pegged": 0.0, "disk_read_bps": 2e6, "disk_write_bps": 5e6, "disk_busy": 0.02,
        "ib_rx_bps": ib, "ib_tx_bps": ib, "nfs_read_bps": 1e6, "nfs_ops": 50.0}
    if storage:
        v.update(STORAGE_HOST)
    return v


def write_nodes(out: Path, t0: int, days: int) -> list[Path]:
    """Per cluster, one row per node and bucket in the node_exporter connector's file form."""
    paths = []
    for cluster in NODES:
        p = out / f"{cluster}-nodes.csv"
        work = [w for w in fleet() if w.cluster == cluster]
        with p.open("w", newline="", encoding="utf-8") as f:
            wr = csv.writer(f)
            wr.writerow(["start", "node", *NODE_COLUMNS, "observed_s"])
            for b in range(days * DAY // BUCKET):
                hour = b * BUCKET / 3600
                for node in NODES[cluster]:
                    here = [w for w in work if node in w.placement() and w.start_h <= hour < w.start_h + w.hours]
                    running = sum(len(w.placement()[node]) for w in here)
                    storage = any((cluster, w.id) == STORAGE_WAIT for w in here)
                    lockstep = any((cluster, w.id, node) == LOCKSTEP_IB[:3] for w in here)
                    v = _host(cluster, node, hour, running, storage, lockstep)
                    wr.writerow([_iso(t0 + b * BUCKET), node, *("" if v[c] is None else f"{v[c]:g}"
                                                                for c in NODE_COLUMNS), BUCKET])
        paths.append(p)
    return paths


# -- InfiniBand ports (issue 48 §2, the congested link) ---------------------------------------------------------
#: Every hpc node's port mlx5_0/1 waits 1 % of the time all week; gpu-node-03 also has mlx5_2/1, which waits 1 %
#: too but 30 % (with 3 link errors a bucket) while job 1060 runs across gpu-node-02 and gpu-node-03 (hours
#: 110-120): the port under its straggler.
PORT_WAIT = 0.01
CONGESTED_PORT = ("hpc", "gpu-node-03", "mlx5_2", "1", 110.0, 120.0, 0.30, 3.0)


def write_ports(out: Path, t0: int, days: int) -> Path:
    """The hpc nodes' InfiniBand ports per bucket, in the node_exporter connector's per-port file form."""
    cluster, node3, dev3, port3, h0, h1, share, errors = CONGESTED_PORT
    p = out / f"{cluster}-ports.csv"
    with p.open("w", newline="", encoding="utf-8") as f:
        wr = csv.writer(f)
        wr.writerow(["start", "node", "device", "port", "wait_share", "link_errors"])
        for b in range(days * DAY // BUCKET):
            hour = b * BUCKET / 3600
            for node in NODES[cluster]:
                for dev, port in (("mlx5_0", "1"), *(((dev3, port3),) if node == node3 else ())):
                    hot = (node, dev, port) == (node3, dev3, port3) and h0 <= hour < h1
                    wr.writerow([_iso(t0 + b * BUCKET), node, dev, port, f"{share if hot else PORT_WAIT:g}",
                                 f"{errors if hot else 0:g}"])
    return p


def write_telemetry(out: Path, t0: int, days: int, seed: int, telemetry: str = "dcgm") -> list[Path]:
    rng = random.Random(seed)
    paths = []
    for cluster in NODES:
        p = out / f"{cluster}-telemetry.csv"
        with p.open("w", newline="", encoding="utf-8") as f:
            wr = csv.writer(f)
            wr.writerow(["timestamp", "host", "gpu", "uuid", "metric", "value", "model", "pod", "namespace"])
            wr.writerows(_telemetry_rows(cluster, t0, days, rng, telemetry))
        paths.append(p)
    return paths


def _openmetrics_labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def _stock_lines(w: Workload | None, labels: dict[str, str], values: dict[str, float], ts: int, telemetry: str,
                 fields: tuple[str, ...]) -> Iterator[str]:
    """One bucket's samples of one GPU (or MIG instance) of the 2026 site: the stock counters (the GR engine
    reads the share of time a kernel ran, as GPU-Util does), the workload's labels renamed ``exported_*``."""
    if w:
        labels = {**labels, "exported_pod": w.name, "exported_namespace": w.account,
                  "exported_container": w.labels.get("app", "main")}
    text = _openmetrics_labels(labels)
    values = {**values, "gr_engine": values["gpu_util"] / 100.0}
    for fld in fields:
        if telemetry != "util-only" or fld in UTIL_ONLY_FIELDS:
            yield f"{STOCK_FIELDS[fld]}{{{text}}} {values[fld]:.4f} {ts * 1000}\n"


def write_site26_telemetry(out: Path, t0: int, days: int, seed: int, telemetry: str = "dcgm") -> Path:
    """The 2026 site's GPU series as its Prometheus stores them, one sample per series and bucket, saved from
    ``/federate`` (Prometheus text format, millisecond timestamps). dcgm-exporter's labels on a GPU a pod holds
    (``pod``, ``namespace``, ``container``) were renamed ``exported_*`` by the scrape (``honor_labels: false``),
    which gave every series the target's own labels: the exporter's ``pod``, ``namespace`` gpu-operator,
    ``container`` nvidia-dcgm-exporter, ``service``, ``endpoint``, ``job``, ``instance`` (the relabelling the
    Prometheus Operator generates for a ServiceMonitor; see connectors/workload.py)."""
    rng = random.Random(seed * 1000 + 26)  # its own stream: the other clusters' samples do not move
    placed: dict[tuple[str, int], list[Workload]] = {}
    mig: dict[tuple[str, int], list[Workload]] = {}  # MIG slices: their own instance series
    for w in fleet():
        if w.cluster == SITE26:
            for g in w.gpus:
                (mig if w.mig else placed).setdefault((w.node, g), []).append(w)
    p = out / f"{SITE26}-federate.prom"
    with p.open("w", encoding="utf-8") as f:
        for b in range(days * DAY // BUCKET):
            ts = t0 + b * BUCKET
            hour = b * BUCKET / 3600
            for node, (gpus, model) in SITE26_NODES.items():
                exporter, address = SITE26_EXPORTERS[node]
                target = {"Hostname": node, "modelName": model, "container": "nvidia-dcgm-exporter",
                          "endpoint": "gpu-metrics", "instance": address, "job": "nvidia-dcgm-exporter",
                          "namespace": "gpu-operator", "pod": exporter, "service": "nvidia-dcgm-exporter"}
                for g in range(gpus):
                    gpu = {**target, "gpu": str(g), "UUID": site26_uuid(node, g), "device": f"nvidia{g}"}
                    if node == SITE26_MIG_NODE:  # the GPU's own series: board power only (no activity field)
                        power = FREE.at(ts - t0, rng)["power_w"]
                        f.write(f"DCGM_FI_DEV_POWER_USAGE{{{_openmetrics_labels(gpu)}}} {power:.4f} {ts * 1000}\n")
                        for w in mig.get((node, g), []):
                            if w.start_h <= hour < w.start_h + w.hours:
                                labels = {**gpu, "GPU_I_ID": w.mig, "GPU_I_PROFILE": SITE26_MIG_PROFILE}
                                f.writelines(_stock_lines(w, labels, w.profile_at(g, hour, node).at(ts - t0, rng),
                                                          ts, telemetry, MIG_FIELDS))
                        continue
                    running = [w for w in placed.get((node, g), []) if w.start_h <= hour < w.start_h + w.hours]
                    w = running[0] if running else None
                    values = (w.profile_at(g, hour, node) if w else FREE).at(ts - t0, rng)
                    f.writelines(_stock_lines(w, gpu, values, ts, telemetry, tuple(STOCK_FIELDS)))
    return p


#: The demo's grid carbon intensity per cluster (gCO2/kWh): a coal-heavy grid for hpc, a mostly hydro one for k8s
GRID = {"hpc": 380.0, "k8s": 120.0, SITE26: 120.0}


def write_config(out: Path, store_url: str) -> Path:
    cfg = f'''# gpu-audit demo configuration (written by `gpu-audit demo`)
[store]
url = "{store_url}"

[[clusters]]
name = "hpc"
initial_days = 8
[[clusters.allocations]]
kind = "file"
paths = ["hpc-allocations.csv", "hpc-reservations.json"]
[[clusters.telemetry]]
kind = "file"
paths = ["hpc-telemetry.csv"]
[[clusters.telemetry]]
kind = "node_exporter"
paths = ["hpc-nodes.csv"]
port_paths = ["hpc-ports.csv"]

[[clusters]]
name = "k8s"
initial_days = 8
[[clusters.allocations]]
kind = "file"
paths = ["k8s-allocations.json"]
[[clusters.telemetry]]
kind = "file"
paths = ["k8s-telemetry.csv"]
[[clusters.telemetry]]
kind = "inference"
paths = ["k8s-inference.csv"]
[[clusters.telemetry]]
kind = "node_exporter"
paths = ["k8s-nodes.csv"]

[[clusters]]
name = "{SITE26}"
initial_days = 8
[[clusters.allocations]]
kind = "file"
paths = ["{SITE26}-allocations.json"]
# what the site's Prometheus stores, saved from /federate: workload labels are exported_pod/... (honorLabels
# false); exporter pods (gpu-operator/nvidia-dcgm-exporter-*) are never taken for a workload
[[clusters.telemetry]]
kind = "scrape"
paths = ["{SITE26}-federate.prom"]

[prices]
currency = "USD"
default = 2.0
models = {{ h100 = 4.0, a100 = 2.5, l40s = 1.0 }}

[[teams]]
name = "llm"
accounts = ["team-a"]
emails = ["llm-leads@example.com"]
idle_budget_gpu_hours = 200.0

[[teams]]
name = "platform"
accounts = ["team-b"]
namespaces = ["inference"]
emails = ["platform@example.com"]

[[teams]]
name = "research"
namespaces = ["research", "ml-train"]
emails = ["research-leads@example.com"]
idle_budget_gpu_hours = 24.0

[email]
sender = "gpu-audit@example.com"
admin_to = ["gpu-platform@example.com"]
user_domain = "example.com"

[report]
out_dir = "reports"

# carbon: kg CO2 = kWh x the cluster's grid intensity (gCO2/kWh) / 1000; idle power (W) prices the energy of
# reserved time without a power reading (the exporter gaps)
[energy]
grid_gco2_per_kwh = {{ hpc = {GRID["hpc"]}, k8s = {GRID["k8s"]}, {SITE26} = {GRID[SITE26]} }}
idle_power_w = {{ h100 = 70.0, a100 = 50.0, l40s = 35.0 }}
'''
    p = out / "demo.toml"
    p.write_text(cfg, encoding="utf-8")
    return p


#: The demo's own store, in --out (unless --store names another)
DB_FILE = "gpu-audit-demo.db"


def _store_files(out: Path) -> list[Path]:
    db = out / DB_FILE
    return [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]


def clear_or_refuse(out: Path, store_url: str | None, fresh: bool) -> None:
    """A store left by an earlier demo in ``out`` (or a --store that holds data) would keep its watermarks,
    so a new week would be collected only from where the old one ended and priced against the wrong hours:
    refuse it, or with ``fresh`` delete the demo's own SQLite file (and its reports). A --store given by URL
    is never emptied: it must be empty.

    ``out`` must be a directory the demo made (or an empty one), and ``fresh`` deletes only files the demo
    recorded writing there (:mod:`auditor.owned`): a user's file of any name is never touched."""
    from auditor.config import sqlite_file
    from auditor.config.base import check_store_url
    from auditor.errors import GpuAuditError

    owned.claim(out, "the demo")
    owned.check(out, [out / n for n in written_names()])  # refused before anything is deleted
    if store_url is None:
        files = _store_files(out)
        if not any(f.exists() for f in files):
            return
        if not fresh:
            raise GpuAuditError(f"{out} already holds a demo store ({files[0]}); pass --fresh to start over, or "
                                "choose another --out (a store's watermarks would skip most of the new week)")
        owned.remove(out, files)
        reports = out / "reports"
        owned.remove(reports, [p for p in owned.recorded(reports)
                               if p.match("report-*.*") or p.match("findings-*.csv")])
        for f in files:
            if f.exists():
                raise GpuAuditError(f"refusing to delete {f}: the demo did not record writing it "
                                    f"({out / owned.MANIFEST}); choose another --out")
        return
    try:
        check_store_url(store_url, "--store")
    except ValueError as exc:
        raise GpuAuditError(str(exc)) from None
    file = sqlite_file(store_url)
    if file is not None and not file.exists():
        return
    from sqlalchemy import func, select

    from auditor.store import schema
    from auditor.store.engine import Store

    store = Store.open(store_url)
    try:
        if store.current() is None:
            return
        with store.engine.connect() as conn:
            held = conn.execute(select(func.count()).select_from(schema.watermarks)).scalar() or 0
    finally:
        store.engine.dispose()
    if held:
        raise GpuAuditError(f"--store {store.redacted_url()} already holds collected data ({held} watermarks); "
                            "give the demo an empty store (--fresh replaces only the demo's own SQLite file)")


def generate(out: Path, *, now: datetime | None = None, days: int = 7, seed: int = 7,
             store_url: str | None = None, telemetry: str = "dcgm") -> tuple[Path, datetime, datetime]:
    """Write the demo files and config into ``out``; returns (config path, week start, week end).
    ``telemetry="util-only"`` writes the same week as a GPU-Util-only site (no profiling fields)."""
    if telemetry not in TELEMETRY_KINDS:
        raise ValueError(f"telemetry {telemetry!r}: expected one of {', '.join(TELEMETRY_KINDS)}")
    owned.claim(out, "the demo")
    # the demo writes only files it wrote before (or new ones), checked before the first is written
    owned.check(out, [out / n for n in written_names()])
    end = floor_to(now or utcnow(), 3600)
    start = end - timedelta(days=days)
    t0 = int(start.timestamp())
    paths = [*write_allocations(out, t0), *write_telemetry(out, t0, days, seed, telemetry),
             write_site26_telemetry(out, t0, days, seed, telemetry), write_inference(out, t0),
             *write_nodes(out, t0, days), write_ports(out, t0, days)]
    url = store_url or f"sqlite:///{(out / DB_FILE).resolve()}"
    cfg = write_config(out, url)
    owned.record(out, [*paths, cfg])
    if store_url is None:
        owned.record(out, _store_files(out), store=True)
    return cfg, start, end


def written_names() -> list[str]:
    """The names of every file :func:`generate` writes into its directory (besides the store)."""
    return ["hpc-allocations.csv", "hpc-reservations.json", "k8s-allocations.json", "k8s-inference.csv",
            f"{SITE26}-allocations.json", f"{SITE26}-federate.prom",
            "demo.toml", "hpc-ports.csv", *(f"{c}-{kind}.csv" for c in NODES for kind in ("telemetry", "nodes"))]
