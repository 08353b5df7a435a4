"""One rank of the trainer (docs/design.md §11, §12): :class:`TrainerWorker`, the state a Ray Train worker keeps
for a whole flow run, and the methods the driver calls on it (:mod:`rlcr.train.rpc`).

A worker loads the policy (and, for β > 0, the frozen reference) once, wraps it with ``prepare_model`` (DDP) or,
with ``cfg.update.fsdp``, shards it and the reference with FSDP2 (:mod:`rlcr.train.fsdp`; gloo on CPU, NCCL on
GPU), builds the run's one AdamW and its LR schedule and, with ``restore``, loads the training state saved with
the checkpoint. Then, for every call, on every rank:

* :meth:`TrainerWorker.update`: one iteration's :func:`rlcr.train.update.train_update` with that same optimizer
  and schedule; rank 0 returns the metrics and the new weights in Ray's object store (:meth:`~TrainerWorker.weights`);
* :meth:`TrainerWorker.save`: rank 0 writes the training state, sealed, after checking the writer's lease —
  with ``background``, in a thread of its own while the driver goes on (the next rollouts), collected by
  :meth:`TrainerWorker.saved`; the next update waits for it, so the state being written never changes (under
  FSDP every rank writes its shard of AdamW's state: :meth:`TrainerWorker._write_sharded`);
* :meth:`TrainerWorker.stop`.

With ``lora.enabled`` (docs/design.md §11.1) the policy is the base with ``peft`` adapters (:mod:`rlcr.train.lora`):
AdamW holds the adapters, π_ref is the policy with its adapters disabled, the engines get the adapters
(:class:`rlcr.models.adapters.AdapterUpdate`) and a save writes an adapter checkpoint naming its base.

Every method is a collective under DDP/FSDP (all ranks run it); what only rank 0 returns is None elsewhere. Under
FSDP the weights rank 0 hands to the engines and writes are the shards gathered into full tensors on its CPU, one
weight at a time; the AdamW state is not gathered: each rank writes its own shard with torch.distributed.checkpoint
into the checkpoint's ``optimizer/`` folder (:mod:`rlcr.train.sharded_state`), and any number of DDP or FSDP
workers reads it back (:meth:`TrainerWorker._restore` reads DDP's whole state and FSDP's shards alike).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from rlcr.config import RLCRConfig
from rlcr.models.adapters import fetch_model, is_adapter_dir
from rlcr.models.weights import BucketWriter, SameAs, WeightBuckets, read_frame, resolve_dtype
from rlcr.runs.cluster import pin_to_cpus
from rlcr.seeds import update_seed
from rlcr.storage import Store, fetch_checkpoint
from rlcr.train.batching import prepare_samples
from rlcr.train.checkpoint import TRAINING_STATE_FILE, NonFiniteError, save_adapter_checkpoint, save_checkpoint
from rlcr.train.logprobs import CompletionLogProbs
from rlcr.train.lora import AdapterOff, adapter_update, load_adapter_state, wrap_lora
from rlcr.train.update import Schedule, autocast_dtype, make_optimizer, train_update
from rlcr.untrusted import printable

__all__ = ["TrainerWorker", "WorkerInfo", "UpdateOut", "SaveOut", "train_loop_per_worker", "load_policy"]

log = logging.getLogger(__name__)

TRAINING_STATE_FORMAT = 1
"""``format`` of :data:`~rlcr.train.checkpoint.TRAINING_STATE_FILE` with AdamW's whole state in it (DDP, LoRA)."""
SHARDED_STATE_FORMAT = 2
"""``format`` of a training state whose AdamW state is in :data:`rlcr.train.sharded_state.OPTIMIZER_DIR` (FSDP)."""
SAVE_TIMEOUT_S = 1800
"""How long a rank of a sharded save waits for the others' collectives (the plan, the file lists) before it fails."""


@dataclass(frozen=True)
class WorkerInfo:
    """Where a rank runs and what it started from."""

    rank: int
    pid: int
    node_id: str
    restored: bool
    schedule: tuple[int, int]


@dataclass(frozen=True)
class UpdateOut:
    """Rank 0's answer to an update: its metrics and the new weights in Ray's object store
    (:class:`~rlcr.models.weights.WeightBuckets`; LoRA: an ObjectRef of the adapters)."""

    metrics: dict[str, Any]
    weights: Any


@dataclass(frozen=True)
class SaveOut:
    """Rank 0's answer to a save: the sealed checkpoint's URI, or why the upload was refused (lease lost)."""

    uri: str | None = None
    refused: str | None = None
    pending: bool = False
    """A background save was started: :meth:`TrainerWorker.saved` gives its outcome."""
    write_s: float = 0.0
    """Seconds the write took (lease check, files, seal), wherever it ran."""


def load_policy(uri: str, cfg: RLCRConfig, *, device: torch.device | str = "cpu"):
    """(tokenizer, causal LM in float32 on ``device``) from a checkpoint URI (local or s3://)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = fetch_model(uri, endpoint_url=cfg.storage.s3_endpoint_url)
    tokenizer = AutoTokenizer.from_pretrained(local)
    lm = AutoModelForCausalLM.from_pretrained(local, dtype=torch.float32).to(device)
    return tokenizer, lm


def _fetch_first_on_local_rank0(uri: str, cfg: RLCRConfig, *, merge: bool = True) -> str:
    """Download a remote checkpoint (and merge an adapter checkpoint, unless not ``merge``) once per node before
    the others read the cache; its local path."""
    import ray.train
    import torch.distributed as dist

    if ray.train.get_context().get_local_rank() == 0:
        (fetch_model if merge else fetch_checkpoint)(uri, endpoint_url=cfg.storage.s3_endpoint_url)
    if dist.is_initialized():
        dist.barrier()
    return str((fetch_model if merge else fetch_checkpoint)(uri, endpoint_url=cfg.storage.s3_endpoint_url))


class TrainerWorker:
    """One rank's model, reference, optimizer and schedule, for a whole flow run (module docstring)."""

    METHODS = ("describe", "update", "save", "saved", "stop")
    """What the driver may call (:func:`rlcr.train.rpc.serve`)."""

    def __init__(self, cfg: RLCRConfig, *, policy_uri: str, ref_uri: str | None, restore: bool):
        import ray.train
        import ray.train.torch

        self.cfg = cfg
        ctx = ray.train.get_context()
        self.rank, self.world_size = ctx.get_world_rank(), ctx.get_world_size()
        device = ray.train.torch.get_device()
        torch.manual_seed(cfg.run.seed)
        if device.type == "cpu" and not pin_to_cpus(cfg.placement.trainer_cpus, "placement.trainer_cpus"):
            # Ray pins OMP_NUM_THREADS=1 per worker; give each worker its share of this node's cores.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, ctx.get_local_world_size())))

        raw = _fetch_first_on_local_rank0(policy_uri, cfg, merge=False)
        self.peft = None
        if cfg.lora.enabled:
            local = self._load_lora(raw, policy_uri, restore=restore, device=device)
            policy = CompletionLogProbs(self.lm)
            self.ref = AdapterOff(policy, self.peft) if cfg.loss.kl_coef > 0 else None  # the frozen base
        else:
            if is_adapter_dir(raw) and restore:
                raise ValueError(f"{policy_uri}: an adapter checkpoint (a LoRA run's); resume it with lora.enabled")
            local = _fetch_first_on_local_rank0(policy_uri, cfg)
            self.tokenizer, self.lm = load_policy(local, cfg, device=device)
            self.ref = None
            if cfg.loss.kl_coef > 0:
                _fetch_first_on_local_rank0(ref_uri, cfg)
                _, ref_lm = load_policy(ref_uri, cfg, device=device)
                self.ref = CompletionLogProbs(ref_lm.eval().requires_grad_(False))
            policy = CompletionLogProbs(self.lm)
        # the trainable parameters' names in AdamW's order (a training state saved by DDP or FSDP resumes in either)
        self._param_names = [n for n, p in policy.named_parameters() if p.requires_grad]
        if cfg.update.fsdp:  # FSDP2: each decoder layer, then the root; the reference too (rlcr.train.fsdp)
            from rlcr.train.fsdp import shard

            self.model = shard(policy, self.lm, param_dtype=cfg.update.fsdp_param_dtype)
            if self.ref is not None:
                self.ref = shard(self.ref, self.ref.lm, param_dtype=cfg.update.fsdp_param_dtype)
        else:
            self.model = ray.train.torch.prepare_model(policy, parallel_strategy="ddp")
        self.optimizer = make_optimizer(self.model, cfg)
        self.schedule = Schedule.for_run(cfg)
        self._save_group = None
        if cfg.update.fsdp:  # a sharded save's collectives, apart from the update's (a save may run in a thread)
            from datetime import timedelta

            import torch.distributed as dist

            self._save_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=SAVE_TIMEOUT_S))
        self.restored = bool(restore) and self._restore(local, policy_uri)
        tok = self.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self._save: tuple[threading.Thread, dict[str, Any]] | None = None  # a background save and its outcome
        self._peak: float | None = None  # fp32 matmul GFLOP/s of this device, measured at the first update
        self._params = 0

    def _load_lora(self, raw: str, policy_uri: str, *, restore: bool, device) -> str:
        """Load the base and wrap it with adapters (:func:`rlcr.train.lora.wrap_lora`); a resume (``restore`` of
        an adapter checkpoint) loads the checkpoint's base and its adapters. Returns the directory the training
        state is restored from (the raw checkpoint)."""
        from rlcr.models.adapters import base_dir, base_reference, read_adapter

        cfg = self.cfg
        resume = bool(restore) and is_adapter_dir(raw)
        if restore and not resume:
            raise ValueError(f"{policy_uri}: not an adapter checkpoint; a lora.enabled run resumes from its own")
        if resume:  # base_dir checks the recorded content id
            model_dir = str(base_dir(raw, endpoint_url=cfg.storage.s3_endpoint_url))
            info = read_adapter(raw)
            self.base_uri, self.base_content_id = info.base, info.base_content_id
        else:  # a new run: the model it starts from (merged, if an adapter checkpoint) is the base
            model_dir = _fetch_first_on_local_rank0(policy_uri, cfg)
            self.base_uri, self.base_content_id = base_reference(
                policy_uri, fetch_checkpoint(policy_uri, endpoint_url=cfg.storage.s3_endpoint_url))
        self.base_frame = read_frame(model_dir)
        self.tokenizer, lm = load_policy(model_dir, cfg, device=device)
        self.peft = wrap_lora(lm, cfg)  # A from torch's RNG, seeded above: the same on every rank
        if resume:
            load_adapter_state(self.peft, raw)
        self.lm = lm  # the same module, its targeted linears now LoRA layers
        return raw

    # ------------------------------------------------------------ the training state
    def _full_state_dict(self) -> dict[str, torch.Tensor]:
        """The LM's full state dict with Hugging Face names (FSDP: each weight gathered from its shards in turn onto
        rank 0's CPU, :meth:`_named_full_tensors`, a collective; the other ranks get an empty dict). A tied weight is
        its twin's tensor again, as in DDP's state dict."""
        if not self.cfg.update.fsdp:
            return self.lm.state_dict()
        sd: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, t in self._named_full_tensors():
                if t is not None:
                    sd[name] = sd[t.name] if isinstance(t, SameAs) else t
        return sd

    def _training_state(self) -> dict[str, Any]:
        """AdamW's whole state (DDP, LoRA; under FSDP it is saved by shard instead: :meth:`_write_sharded`), the
        schedule position and the RNG."""
        state: dict[str, Any] = {"schedule": {"done": self.schedule.done, "total": self.schedule.total},
                                 "rng": {"torch": torch.get_rng_state()}}
        if self.cfg.update.fsdp:  # before the first step AdamW has no state: nothing to shard (None)
            from rlcr.train.sharded_state import OPTIMIZER_DIR

            return {**state, "optimizer": OPTIMIZER_DIR if self.optimizer.state else None,
                    "world_size": self.world_size, "format": SHARDED_STATE_FORMAT}
        return {**state, "optimizer": self.optimizer.state_dict(), "format": TRAINING_STATE_FORMAT}

    def _restore(self, local_dir: str, policy_uri: str) -> bool:
        """Load the AdamW state, schedule position and RNG saved next to the weights.

        A checkpoint to restore must hold them, in this format: a resume from one without (weights saved with
        ``with_optimizer=False``, or by an rlcr before the training state existed) would silently restart AdamW
        and the LR schedule, which is not the run continuing, so it is an error naming the file."""
        path = os.path.join(local_dir, TRAINING_STATE_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{policy_uri}: no {TRAINING_STATE_FILE} to restore (AdamW, schedule, RNG)")
        state = torch.load(path, map_location="cpu", weights_only=False)
        formats = (TRAINING_STATE_FORMAT, SHARDED_STATE_FORMAT)
        if not isinstance(state, dict) or state.get("format") not in formats:
            got = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{policy_uri}/{TRAINING_STATE_FILE}: format {got!r}, expected one of {formats}")
        from rlcr.train.fsdp import optimizer_state_by_index, optimizer_state_by_name
        from rlcr.train.sharded_state import OPTIMIZER_DIR, load_optimizer_shards

        optimizer = state.get("optimizer")
        if state["format"] == SHARDED_STATE_FORMAT:  # AdamW by shard, as N FSDP workers wrote it: read by these M
            where = f"{policy_uri}/{OPTIMIZER_DIR}"
            if optimizer is None:  # saved before AdamW's first step: it starts fresh, as it did
                pass
            elif optimizer != OPTIMIZER_DIR or not os.path.isdir(os.path.join(local_dir, OPTIMIZER_DIR)):
                raise ValueError(f"{policy_uri}/{TRAINING_STATE_FILE}: AdamW's state is saved by shard, but "
                                 f"{where} is not there")
            else:
                try:
                    load_optimizer_shards(self.model, self.optimizer, os.path.join(local_dir, OPTIMIZER_DIR),
                                          source=where)
                except (ValueError, OSError, RuntimeError) as e:  # a missing tensor, a shape, a bad file: one line
                    raise ValueError(f"cannot restore AdamW's state saved by {state.get('world_size', '?')} "
                                     f"workers on {self.world_size}: {printable(str(e), 400)}") from None
            self.schedule.done, self.schedule.total = (int(state["schedule"]["done"]),
                                                       int(state["schedule"]["total"]))
            torch.set_rng_state(state["rng"]["torch"])
            return True
        try:
            keys = [k for g in optimizer["param_groups"] for k in g["params"]]
            by_name = bool(keys) and isinstance(keys[0], str)  # saved under FSDP (names) or DDP (positions)
            if self.cfg.update.fsdp and not optimizer["state"]:
                pass  # saved before AdamW's first step (DCP's call would initialise it with a step): fresh, as it was
            elif self.cfg.update.fsdp:
                from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

                if not by_name:
                    optimizer = optimizer_state_by_name(optimizer, self._param_names)
                # every rank read the full state: each keeps its own shard of it
                set_optimizer_state_dict(self.model, self.optimizer, optim_state_dict=optimizer,
                                         options=StateDictOptions(full_state_dict=True))
            else:
                if by_name:
                    optimizer = optimizer_state_by_index(optimizer, self._param_names)
                self.optimizer.load_state_dict(optimizer)
        except (ValueError, KeyError, TypeError, RuntimeError) as e:
            raise ValueError(f"{policy_uri}/{TRAINING_STATE_FILE}: cannot restore AdamW's state: {e}") from e
        self.schedule.done, self.schedule.total = int(state["schedule"]["done"]), int(state["schedule"]["total"])
        torch.set_rng_state(state["rng"]["torch"])
        return True

    # ------------------------------------------------------------ the driver's calls
    def describe(self) -> WorkerInfo:
        import ray

        return WorkerInfo(rank=self.rank, pid=os.getpid(), node_id=ray.get_runtime_context().get_node_id(),
                          restored=self.restored, schedule=(self.schedule.done, self.schedule.total))

    def update(self, rows, iteration: int) -> UpdateOut | None:
        """One iteration's update of ``rows`` (an ObjectRef of the rollout rows; every rank reads them all);
        rank 0 returns the metrics and the new weights (:meth:`weights`)."""
        import ray

        self._join_save()  # a background save may still be reading the weights and AdamW state this changes
        t0 = time.perf_counter()
        samples = prepare_samples(ray.get(rows), self.tokenizer)
        prepare_s = time.perf_counter() - t0
        metrics = train_update(
            self.model, samples, self.cfg, pad_id=self.pad_id, ref=self.ref, rank=self.rank,
            world_size=self.world_size, seed=update_seed(self.cfg.run.seed, int(iteration)),
            optimizer=self.optimizer, schedule=self.schedule,
        )
        metrics["schedule_step"] = self.schedule.done
        metrics.update(self._throughput(metrics))
        t0 = time.perf_counter()
        weights = self.weights(iteration)
        # where the update stage's time goes besides prepass_s and train_s (the rest is the call's transfer)
        metrics.update(prepare_s=prepare_s, weights_s=time.perf_counter() - t0)
        if isinstance(weights, WeightBuckets):  # what the engines will load, and the most rank 0 held at once
            metrics.update(weights_buckets=len(weights.refs), weights_bytes=weights.bytes,
                           weights_bucket_max_bytes=weights.largest)
        return UpdateOut(metrics=metrics, weights=weights) if self.rank == 0 else None

    def _throughput(self, metrics: dict) -> dict[str, float]:
        """``gflops``: the update's nominal GFLOP/s over all ranks (:mod:`rlcr.train.throughput`, as
        ``bench/perf/update.py`` counts them); ``matmul_gflops``: this device's matmul peak in the update's dtype
        (:func:`rlcr.train.update.autocast_dtype`: bf16 under bf16 autocast), measured once per worker (≈ 0.4 s on
        a 2-core CPU), times the ranks; ``peak_fraction``: their ratio."""
        from rlcr.train.throughput import matmul_gflops, update_gflops

        if self._peak is None:
            device = next(self.model.parameters()).device
            self._peak = matmul_gflops(2048, 2, device=device, dtype=autocast_dtype(device, self.cfg.update.autocast))
            self._params = sum(p.numel() for p in {id(p): p for p in self.model.parameters()}.values())
        params = self._params
        rate = update_gflops(params, metrics.get("padded_tokens", 0.0), metrics["train_s"] + metrics["prepass_s"])
        peak = self._peak * self.world_size
        return {"gflops": rate, "matmul_gflops": peak, "peak_fraction": rate / peak}

    def weights(self, iteration: int):
        """Rank 0: the new weights for the engines, checked finite, in Ray's object store (DDP and FSDP alike:
        :class:`~rlcr.models.weights.WeightBuckets` of ``engine.sync_bucket_mib``, in the engines' dtype; LoRA: the
        adapters' ObjectRef); other ranks: None (under FSDP they take part in each weight's gathering)."""
        import ray

        if self.peft is not None:  # LoRA: only the adapters travel; the engines merge them into their base
            return ray.put(adapter_update(self.peft)) if self.rank == 0 else None
        if self.rank != 0 and not self.cfg.update.fsdp:
            return None
        # the engines' dtype: they would round fp32 to bf16 on load anyway, so this halves the bytes on GPU
        writer = BucketWriter(int(self.cfg.engine.sync_bucket_mib * 2 ** 20),
                              dtype=getattr(torch, resolve_dtype(self.cfg.model.dtype)))
        # under FSDP every rank must make every gather: what goes wrong on rank 0 (a non-finite weight, a full
        # object store) is held until the walk ends, then raised
        bad: str | None = None
        error: BaseException | None = None
        with torch.no_grad():
            for name, tensor in self._named_full_tensors():
                if tensor is None or bad is not None or error is not None:
                    continue
                if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and not torch.isfinite(tensor).all():
                    bad = name
                    continue
                try:
                    writer.add(name, tensor)
                except Exception as e:  # noqa: BLE001 - raised below, after the other ranks' gathers
                    error = e
        if self.rank != 0:
            return None
        if error is not None:
            raise error
        if bad is not None:
            raise NonFiniteError(f"update of iteration {iteration}: parameter {bad!r} "
                                 f"has non-finite values; the engines keep the previous weights")
        return writer.close()

    def _named_full_tensors(self):
        """``(Hugging Face name, full tensor)`` of each parameter and buffer, one at a time (a tied weight once, then
        :class:`~rlcr.models.weights.SameAs` its first name). Under FSDP each sharded parameter is gathered as it
        comes (a collective: every rank walks the same names) onto rank 0's CPU; the other ranks get None. The full
        model never exists at once."""
        from torch.distributed.tensor import DTensor

        first: dict[int, str] = {}
        for name, t in self.lm.state_dict(keep_vars=True).items():
            twin = first.setdefault(id(t), name)
            if twin != name:  # a tied weight (lm_head = the embedding): a reference to its twin, as pack_weights sends
                yield name, (SameAs(twin) if self.rank == 0 else None)
                continue
            if isinstance(t, DTensor):
                full = t.full_tensor()
                yield name, (full.cpu() if self.rank == 0 else None)
                del full
            else:
                yield name, (t.detach() if self.rank == 0 else None)

    def save(self, rel: str, extra: dict[str, Any], with_optimizer: bool,
             fence: dict[str, str] | None = None, background: bool = False) -> SaveOut | None:
        """Rank 0 writes the weights, tokenizer and (``with_optimizer``) training state, sealed, at ``rel`` — after
        checking ``fence``, the writer's lease, just before the upload (under FSDP every rank writes its shard of
        AdamW's state: :meth:`_write_sharded`). ``background``: the write runs in a thread (the answer is
        ``SaveOut(pending=True)``; :meth:`saved` waits for it); what it writes is taken now (the RNG, the schedule
        position) or not changed before it ends (weights and AdamW state: the next :meth:`update` waits for it)."""
        self._join_save()
        training_state = self._training_state() if with_optimizer else None
        if self.cfg.update.fsdp:
            from rlcr.train.sharded_state import optimizer_shards

            state = self._full_state_dict()  # collectives: all ranks
            # (not before the first step: DCP's state-dict call would initialise AdamW with a step of lr 0)
            shards = optimizer_shards(self.model, self.optimizer) if with_optimizer and self.optimizer.state else None
            write = lambda: self._write_sharded(rel, extra, fence, state, shards, training_state)  # noqa: E731
        elif self.rank != 0:
            return None
        else:
            write = lambda: self._write(rel, extra, fence, None, training_state)  # noqa: E731
        if not background:
            return write()
        outcome: dict[str, Any] = {}

        device = next(self.model.parameters()).device

        def run() -> None:
            if device.type == "cuda":  # a new thread starts on cuda:0; DCP's copies run on this rank's GPU
                torch.cuda.set_device(device)
            try:
                outcome["out"] = write()
            except BaseException as e:  # noqa: BLE001 - handed to saved(), which raises it in its call
                outcome["error"] = e
        thread = threading.Thread(target=run, name=f"rlcr-save-{rel}", daemon=True)
        self._save = (thread, outcome)
        thread.start()
        return SaveOut(pending=True) if self.rank == 0 else None

    def saved(self) -> SaveOut | None:
        """Rank 0: the outcome of the background save started last (waits for it; its error is raised here,
        ending the worker as any failed call does); other ranks (FSDP: after their part is written), or no save
        pending: None."""
        if self._save is None:
            return None
        thread, outcome = self._save
        thread.join()
        self._save = None
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("out")

    def _join_save(self) -> None:
        """Wait for a background save to end (its outcome stays for :meth:`saved`)."""
        if self._save is not None:
            self._save[0].join()

    def _write(self, rel: str, extra: dict[str, Any], fence: dict[str, str] | None, state, training_state) -> SaveOut:
        t0 = time.perf_counter()
        store = Store(self.cfg.storage.uri, endpoint_url=self.cfg.storage.s3_endpoint_url)
        if fence:
            from rlcr.runs.store import LeaseLost, check_fence

            try:
                check_fence(store, fence)
            except LeaseLost as e:
                return SaveOut(refused=str(e), write_s=time.perf_counter() - t0)
        if self.peft is not None:
            uri = save_adapter_checkpoint(self.peft, store, rel, frame=self.base_frame, base_uri=self.base_uri,
                                          base_content_id=self.base_content_id, extra=extra,
                                          training_state=training_state)
        else:
            uri = save_checkpoint(self.lm, self.tokenizer, store, rel, state_dict=state, extra=extra,
                                  training_state=training_state)
        return SaveOut(uri=uri, write_s=time.perf_counter() - t0)

    def _write_sharded(self, rel: str, extra: dict[str, Any], fence: dict[str, str] | None, state,
                       shards: dict[str, Any] | None, training_state: dict[str, Any] | None) -> SaveOut | None:
        """A sharded save, on every rank (FSDP), its collectives on a group of their own: rank 0 checks ``fence``
        and opens the checkpoint's shared directory (:meth:`rlcr.storage.Store.open_shared`); every rank writes its
        shard of AdamW's state there with DCP (S3: uploaded after its own check of the lease); rank 0 gathers
        the files each rank wrote (or why it could not), writes the gathered weights, the tokenizer and the small
        training state, checks the lease again and seals the whole. Rank 0 answers; the others return None."""
        import torch.distributed as dist

        from rlcr.runs.store import LeaseLost, check_fence
        from rlcr.storage import StorageError
        from rlcr.train.checkpoint import check_finite_weights, write_checkpoint_files

        t0 = time.perf_counter()
        group = self._save_group
        store = Store(self.cfg.storage.uri, endpoint_url=self.cfg.storage.s3_endpoint_url)
        fenced = (lambda: check_fence(store, fence)) if fence else None  # noqa: E731
        head: list[Any] = [None]
        error: BaseException | None = None
        if self.rank == 0:
            try:
                check_finite_weights(self.lm, state)
                if fenced:
                    fenced()
                head[0] = ("open", store.open_shared(rel))
            except LeaseLost as e:
                head[0] = ("refused", str(e))
            except Exception as e:  # noqa: BLE001 - the others learn that it failed; rank 0 raises it
                head[0], error = ("error", type(e).__name__), e
        dist.broadcast_object_list(head, src=0, group=group)
        kind, where = head[0]
        if kind != "open":
            if self.rank != 0:
                return None
            if error is not None:
                raise error
            return SaveOut(refused=where, write_s=time.perf_counter() - t0)
        mine: dict[str, int] = {}
        problem: tuple[str, str] | None = None
        if shards is not None:
            mine, problem = self._write_shard(store, where, shards, fenced)
        parts: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object((mine, problem), parts, dst=0, group=group)
        if self.rank != 0:
            return None
        try:
            problems = [p for _, p in parts if p is not None]
            if any(k == "refused" for k, _ in problems):
                store.abandon_shared(where)
                return SaveOut(refused=next(m for k, m in problems if k == "refused"),
                               write_s=time.perf_counter() - t0)
            if problems:
                raise StorageError(f"{store.url(rel)}: a sharded save failed: {problems[0][1]}")
            with store.shared_part(where, "", before_upload=fenced) as part:
                write_checkpoint_files(part.dir, self.lm, self.tokenizer, state_dict=state, extra=extra,
                                       training_state=training_state)
            files = dict(part.files)
            for theirs, _ in parts:
                files.update(theirs)
            if fenced:
                fenced()
            uri = store.seal_shared(rel, where, files)
        except LeaseLost as e:
            store.abandon_shared(where)
            return SaveOut(refused=str(e), write_s=time.perf_counter() - t0)
        except BaseException:
            store.abandon_shared(where)
            raise
        return SaveOut(uri=uri, write_s=time.perf_counter() - t0)

    def _write_shard(self, store: Store, where: str, shards: dict[str, Any], fenced) -> tuple[dict[str, int], Any]:
        """This rank's AdamW shard into the shared directory ``where`` (every rank calls it): its folder made ready
        on every rank first (agreed on the save's group, so no rank enters DCP's collectives alone), then DCP's
        save, then (S3) the upload after ``fenced()``. Returns (the files it wrote, None) or ({}, (why)), where
        why is ``("refused", message)`` for a lost lease and ``("error", message)`` otherwise."""
        import contextlib

        import torch.distributed as dist

        from rlcr.runs.store import LeaseLost
        from rlcr.train.sharded_state import OPTIMIZER_DIR, save_optimizer_shards

        def said(e: BaseException) -> str:
            return f"rank {self.rank}: {type(e).__name__}: {printable(str(e), 300)}"

        stack = contextlib.ExitStack()
        ready: str | None = None
        part = None
        try:
            part = stack.enter_context(store.shared_part(where, OPTIMIZER_DIR, before_upload=fenced))
        except Exception as e:  # noqa: BLE001 - every rank learns it below
            ready = said(e)
        readies: list[Any] = [None] * self.world_size
        dist.all_gather_object(readies, ready, group=self._save_group)
        failed = next((r for r in readies if r), None)
        if failed:
            stack.close()
            return {}, ("error", failed)
        try:
            with stack:  # its end uploads (S3), after the lease check
                save_optimizer_shards(shards, part.dir, process_group=self._save_group)
        except LeaseLost as e:
            return {}, ("refused", str(e))
        except Exception as e:  # noqa: BLE001 - reported to rank 0, which raises it
            return {}, ("error", said(e))
        return part.files, None

    def stop(self) -> None:
        """The last call: :func:`rlcr.train.rpc.serve` returns after it, so the worker's function ends (after a
        background save still writing: it is not cut off half-way)."""
        self._join_save()


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's function for each worker: build this rank's :class:`TrainerWorker` and serve the driver's
    calls until :meth:`~TrainerWorker.stop` (an error in a call ends it, and ``fit()`` with it)."""
    import ray.train

    from rlcr.train.rpc import serve

    rank = ray.train.get_context().get_world_rank()
    worker = TrainerWorker(RLCRConfig.model_validate(config["cfg"]), policy_uri=config["policy_uri"],
                           ref_uri=config["ref_uri"], restore=config["restore"])
    serve(worker, TrainerWorker.METHODS, config["inboxes"][rank], config["outbox"], rank=rank)
