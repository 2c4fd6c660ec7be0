"""stepwatch.torch: automatic step timing for PyTorch (DistributedDataParallel or a plain module).

    import stepwatch.torch
    model = DistributedDataParallel(model)
    stepwatch.torch.watch(model, loader)   # the training loop stays as it is

What is measured, per step and rank (all on the host clock, time.perf_counter):
- step boundaries: a step starts when the loop asks the watched DataLoader for its batch (or,
  without a loader, when the model's forward is called) and ends where the next one starts. Under
  gradient accumulation (DDP no_sync) the forwards up to the one whose backward all-reduces form
  one step.
  Forwards in eval mode or under torch.no_grad() end the open step and are not steps themselves.
- data_s: time inside the DataLoader iterator's __next__ (only with a watched loader).
- comm_s: EXPOSED communication: the time the step is blocked waiting for DDP's gradient
  all-reduces, not the time they take while backward still computes (overlapped, free). A DDP
  communication hook launches each bucket's all-reduce and returns a future of its own; a callback
  queued at the end of backward waits for the all-reduces, times that wait (which includes waiting
  for slower ranks) and completes the futures, before DDP itself waits for them. (Chaining .then()
  on the all-reduce's future crashed ranks at exit with PyTorch 1.13; this does not chain.) On
  CUDA the wait is measured with CUDA events on the current stream instead of the host clock.
  With static_graph=True, where DDP may launch the all-reduces after backward, each all-reduce is
  waited for inside the hook, so it is all blocking and all counted.
- compute_s: the rest of the step (forward, backward, optimizer, anything else in the loop).
- samples: the leading dimension of the first tensor passed to forward, unless given.
The event of a step is sent when the next step starts (or the epoch's loader is exhausted).
"""

import collections
import logging
import os
import threading
import time

import torch
import torch.distributed as dist

from . import reporter as _reporter

__all__ = ["Watch", "watch"]

_LOG = logging.getLogger("stepwatch")
_perf_counter = time.perf_counter
# Steps whose CUDA events have not completed yet; beyond this many the host waits for them.
_MAX_UNRESOLVED_STEPS = 4


def watch(model, dataloader=None, *, reporter=None, samples=None, start_step=0, time_comm=True,
          **reporter_kwargs):
    """Instruments `model` (and `dataloader`) so that every training step is reported.

    model: a DistributedDataParallel model (communication is timed) or any nn.Module.
    dataloader: an iterable of batches (a DataLoader); it is instrumented in place, so the same
      object keeps working in the loop. Objects that cannot be changed in place are wrapped: use the
      returned Watch's .dataloader then (a warning says so).
    reporter: a stepwatch.Reporter; default: one built from reporter_kwargs and the environment,
      with rank and world size from torch.distributed when it is initialized.
    samples: samples per step; default: the batch dimension of the forward's first tensor.
    time_comm: time the step's wait for DDP's all-reduces (exposed communication) with a
      communication hook (the default); the all-reduces still overlap backward. False keeps DDP's
      own hook; events then carry step_s, data_s and samples only, since compute cannot be told
      from communication.
    Returns a Watch; Watch.close() stops reporting.
    """
    if reporter is None:
        if dist.is_available() and dist.is_initialized():
            reporter_kwargs.setdefault("rank", dist.get_rank())
            reporter_kwargs.setdefault("world_size", dist.get_world_size())
        if reporter_kwargs.get("gpu") is None:
            gpu = _gpu_index(model)
            if gpu is not None:
                reporter_kwargs["gpu"] = gpu
        reporter = _reporter.Reporter(**reporter_kwargs)
    elif reporter_kwargs:
        raise ValueError("pass either reporter or reporter arguments, not both")
    return Watch(model, dataloader, reporter, samples=samples, start_step=start_step,
                 time_comm=time_comm)


def _gpu_index(model):
    """The NVML-style index of the GPU the model lives on, or None on CPU."""
    try:
        param = next(model.parameters())
    except (StopIteration, AttributeError, TypeError):
        return None
    if param.device.type != "cuda":
        return None
    index = param.device.index if param.device.index is not None else torch.cuda.current_device()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        entries = [e.strip() for e in visible.split(",")]
        if index < len(entries) and entries[index].isdigit():
            return int(entries[index])
        return None  # UUIDs or MIG names: no plain index to give
    return index


class Watch:
    """Hooks on one model (and loader) that turn its training steps into stepwatch events."""

    def __init__(self, model, dataloader, reporter, *, samples=None, start_step=0,
                 time_comm=True):
        self.reporter = reporter
        self.model = model
        self.dataloader = dataloader
        self._fixed_samples = samples
        self._step = int(start_step)
        self._lock = threading.Lock()  # the comm hook may run on an autograd device thread
        self._active = True
        # Open step.
        self._step_start = None
        self._step_data = 0.0
        self._step_samples = 0
        self._comm_s = 0.0
        self._comm_events = []
        self._comm_seen = False
        # All-reduces launched in this backward, waited for by a callback at its end.
        self._pending_allreduces = None
        # Batches fetched since the last forward: they belong to the step that forward starts.
        self._fetch_start = None
        self._fetch_data = 0.0
        self._unresolved = collections.deque()

        self._ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        self._comm_hooked = False
        if self._ddp and time_comm:
            self._comm_hooked = self._register_comm_hook(model)
        # Compute is the rest of the step: only known when communication is timed or absent.
        self._report_compute = self._comm_hooked or not self._ddp
        self._forward_handle = model.register_forward_pre_hook(self._on_forward)
        self._patched_loader = None
        self._loader_watched = dataloader is not None
        if dataloader is not None:
            self.dataloader = self._instrument_loader(dataloader)

    # ------------------------------------------------------------------ public

    @property
    def step(self):
        """Number of the step that is open (or will open next)."""
        return self._step

    def close(self):
        """Stops reporting: removes the hooks it can (DDP keeps its communication hook, which then
        only all-reduces) and restores the loader. The step still open is not reported."""
        if not self._active:
            return
        self._active = False
        self._forward_handle.remove()
        self._flush_unresolved(wait=True)
        loader = self._patched_loader
        if loader is not None:
            try:
                loader.__class__ = loader.__class__._stepwatch_original_class
                del loader._stepwatch_watch
            except Exception:
                pass
            self._patched_loader = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------------ hooks

    def _on_forward(self, module, inputs):
        try:
            self._forward(inputs)
        except Exception as exc:  # never break the training step
            self.reporter._drop("stepwatch.torch forward hook failed: %r" % (exc,))
        return None

    def _forward(self, inputs):
        now = _perf_counter()
        # A backward that failed never ran its end callback: its all-reduces are not ours to wait.
        self._pending_allreduces = None
        boundary = self._fetch_start if self._fetch_start is not None else now
        if not (self.model.training and torch.is_grad_enabled()):
            # Evaluation: closes the open step; its own time is no step.
            self._finish(boundary)
            self._fetch_start = None
            self._fetch_data = 0.0
            return
        if self._step_start is not None and (self._comm_seen or not self._comm_hooked):
            self._finish(boundary)
        if self._step_start is None:
            self._step_start = boundary
        self._step_data += self._fetch_data
        self._fetch_start = None
        self._fetch_data = 0.0
        if self._fixed_samples is None:
            self._step_samples += _batch_size(inputs)

    def _on_fetch(self, start, end):
        if self._fetch_start is None:
            self._fetch_start = start
        self._fetch_data += end - start

    def _on_exhausted(self, start):
        """The loader ran out: the last step of the epoch ended when the loop asked for more."""
        boundary = self._fetch_start if self._fetch_start is not None else start
        self._finish(boundary)
        self._fetch_start = None
        self._fetch_data = 0.0

    def _finish(self, end):
        """Reports the open step as ending at `end` and clears it."""
        start = self._step_start
        if start is None:
            return
        with self._lock:
            comm_s = self._comm_s
            events = self._comm_events
            self._comm_s = 0.0
            self._comm_events = []
        record = [
            self._step,
            end - start,
            self._step_data,
            comm_s if self._comm_hooked else None,
            self._fixed_samples if self._fixed_samples is not None else self._step_samples,
        ]
        self._step += 1
        self._step_start = None
        self._step_data = 0.0
        self._step_samples = 0
        self._comm_seen = False
        if events:
            self._unresolved.append((record, events))
            self._flush_unresolved(wait=len(self._unresolved) > _MAX_UNRESOLVED_STEPS)
        elif self._unresolved:
            self._unresolved.append((record, events))
            self._flush_unresolved(wait=False)
        else:
            self._send(record)

    def _flush_unresolved(self, wait):
        """Sends the steps whose CUDA events are complete, in order; waits for them if asked."""
        queue = self._unresolved
        while queue:
            record, events = queue[0]
            if events:
                if not wait and not events[-1][1].query():
                    return
                try:
                    record[3] = sum(s.elapsed_time(e) for s, e in events) / 1000.0
                except RuntimeError:
                    record[3] = None  # events from a failed step: report without comm
            queue.popleft()
            self._send(record)

    def _send(self, record):
        step, step_s, data_s, comm_s, samples = record
        compute_s = step_s - data_s - (comm_s or 0.0)
        if compute_s < 0.0:
            compute_s = 0.0
        self.reporter.send(
            step,
            step_s,
            data_s if self._loader_watched else None,
            compute_s if self._report_compute else None,
            comm_s,
            samples if samples else None,
        )

    # ------------------------------------------------------------------ communication

    def _register_comm_hook(self, model):
        group = getattr(model, "process_group", None)
        try:
            model.register_comm_hook(group, self._allreduce_hook)
        except Exception as exc:
            _LOG.warning(
                "stepwatch: cannot time DDP communication (%s); comm_s is not reported", exc
            )
            return False
        return True

    def _allreduce_hook(self, group, bucket):
        """DDP's default all-reduce (average), launched here and waited for at the end of backward,
        so that only the time the step is blocked on it counts as comm_s."""
        buffer = bucket.buffer()
        world = group.size() if group is not None else dist.get_world_size()
        buffer.div_(world)
        work = dist.all_reduce(buffer, group=group, async_op=True)
        if buffer.is_cuda:
            future = torch.futures.Future(devices=[buffer.device])
        else:
            future = torch.futures.Future()
        timed = self._active
        if timed:
            self._comm_seen = True
        pending = self._pending_allreduces
        if pending is None and not getattr(self.model, "static_graph", False):
            pending = []
            try:
                # Queued before DDP's own end-of-backward callback (queued when the last bucket is
                # ready), so the futures are complete when DDP waits for them.
                torch.autograd.Variable._execution_engine.queue_callback(
                    lambda: self._wait_allreduces(pending, timed))
                self._pending_allreduces = pending
            except Exception:  # not inside backward: wait here instead
                pending = None
        if pending is None:
            self._wait_allreduces([(work, buffer, future)], timed)
        else:
            pending.append((work, buffer, future))
        return future

    def _wait_allreduces(self, pending, timed):
        """Waits for the launched all-reduces, times the wait and completes their futures."""
        if pending is self._pending_allreduces:
            self._pending_allreduces = None
        if not pending:
            return
        start_event = None
        if timed and pending[0][1].is_cuda:
            try:
                start_event = torch.cuda.Event(enable_timing=True)
                start_event.record()
            except Exception:  # timing must never break the all-reduce
                start_event = None
        start = _perf_counter()
        error = None
        for work, _buffer, _future in pending:
            try:
                work.wait()
            except Exception as exc:  # DDP raises it when it waits for the future
                error = exc
        if timed and error is None:
            if start_event is not None:
                try:
                    end_event = torch.cuda.Event(enable_timing=True)
                    end_event.record()
                    with self._lock:
                        self._comm_events.append((start_event, end_event))
                except Exception:
                    pass
            elif not pending[0][1].is_cuda:
                elapsed = _perf_counter() - start
                with self._lock:
                    self._comm_s += elapsed
        for _work, buffer, future in pending:
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(buffer)

    # ------------------------------------------------------------------ data loader

    def _instrument_loader(self, loader):
        cls = type(loader)
        try:
            loader.__class__ = _timed_subclass(cls)
            loader._stepwatch_watch = self
        except (TypeError, AttributeError) as exc:
            try:
                loader.__class__ = cls
            except TypeError:
                pass
            _LOG.warning(
                "stepwatch: cannot instrument %s in place (%s); iterate over Watch.dataloader "
                "to have data time measured",
                cls.__name__,
                exc,
            )
            return _TimedIterable(loader, self)
        self._patched_loader = loader
        return loader


def _batch_size(inputs):
    """Leading dimension of the first tensor in the forward's arguments (0 when there is none)."""
    for value in inputs:
        if isinstance(value, torch.Tensor):
            return int(value.shape[0]) if value.dim() > 0 else 1
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            return int(value[0].shape[0]) if value[0].dim() > 0 else 1
        if isinstance(value, dict):
            for item in value.values():
                if isinstance(item, torch.Tensor) and item.dim() > 0:
                    return int(item.shape[0])
    return 0


class _TimedIterator:
    """Wraps a loader's iterator; times each __next__ as data wait."""

    __slots__ = ("_it", "_watch")

    def __init__(self, it, watch_):
        self._it = it
        self._watch = watch_

    def __iter__(self):
        return self

    def __next__(self):
        start = _perf_counter()
        try:
            batch = next(self._it)
        except StopIteration:
            self._watch._on_exhausted(start)
            raise
        self._watch._on_fetch(start, _perf_counter())
        return batch

    def __len__(self):
        return len(self._it)

    def __getattr__(self, name):
        return getattr(self._it, name)


class _TimedIterable:
    """Fallback wrapper for loaders whose class cannot be replaced."""

    def __init__(self, loader, watch_):
        self._loader = loader
        self._watch = watch_

    def __iter__(self):
        it = iter(self._loader)
        return _TimedIterator(it, self._watch) if self._watch._active else it

    def __len__(self):
        return len(self._loader)

    def __getattr__(self, name):
        return getattr(self._loader, name)


_subclasses = {}
_subclasses_lock = threading.Lock()


def _timed_subclass(cls):
    """A subclass of the loader's class whose iterators time each batch."""
    with _subclasses_lock:
        sub = _subclasses.get(cls)
        if sub is None:

            def __iter__(self):
                it = super(sub, self).__iter__()
                w = self.__dict__.get("_stepwatch_watch")
                if w is None or not w._active:
                    return it
                return _TimedIterator(it, w)

            sub = type(
                cls.__name__,
                (cls,),
                {
                    "__iter__": __iter__,
                    "__module__": cls.__module__,
                    "__qualname__": cls.__qualname__,
                    "_stepwatch_original_class": cls,
                },
            )
            _subclasses[cls] = sub
        return sub
