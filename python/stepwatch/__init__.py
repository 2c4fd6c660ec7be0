"""stepwatch: report the timing of every training step to the stepwatch agent on this node.

    import stepwatch

    for batch in loader:
        with stepwatch.step(samples=len(batch)):
            with stepwatch.phase("compute"):
                loss = model(batch)
                loss.backward()
            with stepwatch.phase("comm"):
                sync_gradients()
            with stepwatch.phase("optimizer"):  # a named section: counts as compute too
                optimizer.step()

Each step becomes one JSON datagram (the stepwatch StepEvent) on the agent's Unix socket
($STEPWATCH_SOCKET, default /run/stepwatch/agent.sock). Job, rank and world size come from the
launcher's environment unless given to configure(). Sending never blocks and never raises: when the
agent is absent or busy the event is dropped, counted (get_reporter().dropped) and one warning is
logged on the "stepwatch" logger. The one exception is a programming error: phase() with a name
the agent would refuse raises ValueError at its first use.

For PyTorch DDP, stepwatch.torch.watch(model, dataloader) does all of this without touching the
loop.
"""

import logging
import threading

from ._config import DEFAULT_SOCKET, Identity, resolve
from .reporter import PHASES, Reporter

__all__ = [
    "DEFAULT_SOCKET",
    "PHASES",
    "Identity",
    "Reporter",
    "configure",
    "get_reporter",
    "phase",
    "resolve",
    "step",
]
__version__ = "0.1.0"

_default_lock = threading.Lock()
_default = None


def configure(**kwargs):
    """Replaces the process-wide reporter used by step() and phase(); returns it.

    Takes the Reporter arguments (job, rank, world_size, socket_path, local_rank, gpu, dp_rank,
    pp_stage, tp_rank). Raises ValueError for invalid values.
    """
    global _default
    reporter = Reporter(**kwargs)
    with _default_lock:
        old, _default = _default, reporter
    if old is not None:
        old.close()
    return reporter


def get_reporter():
    """The process-wide reporter, created from the environment on first use.

    An environment that cannot be used (for example RANK=abc) yields a reporter that drops every
    event, after one logged warning, instead of raising inside the training loop.
    """
    global _default
    reporter = _default
    if reporter is not None:
        return reporter
    with _default_lock:
        if _default is None:
            try:
                _default = Reporter()
            except Exception as exc:
                logging.getLogger("stepwatch").warning(
                    "stepwatch: disabled, cannot configure from the environment: %s", exc
                )
                _default = _DisabledReporter(str(exc))
        return _default


def step(samples=None, step=None):
    """`with stepwatch.step(samples=n):` times one training step of the process-wide reporter."""
    # `_default or get_reporter()`: the reporter exists after the first step, so the hot path is
    # one global read (a Reporter is always true). Reporter.step() inlined (a call fewer); a
    # step inside a step takes it, for its warning.
    reporter = _default or get_reporter()
    scope = reporter._step_scope
    if scope._active:
        return reporter.step(samples, step)
    scope.samples = samples
    scope.step = step
    return scope


def phase(name):
    """`with stepwatch.phase("data" | "compute" | "comm"):` times a phase of the current step;
    any other name (`"forward"`, `"backward"`, ...) a named section (see Reporter.phase)."""
    reporter = _default or get_reporter()
    try:  # Reporter.phase() inlined for names already used; it creates the others
        return reporter._phase_scopes[name]
    except (KeyError, TypeError):
        return reporter.phase(name)


class _DisabledReporter(Reporter):
    """Counts and drops every event; used when the environment cannot configure a reporter."""

    def __init__(self, reason):
        super().__init__(job="disabled", rank=0, world_size=1, socket_path="/nonexistent")
        self.last_error = reason
        self._warned = True  # already warned once, at creation

    def send(self, *args, **kwargs):
        self.dropped += 1
        return False

    _send_ns = send  # the path of step()
