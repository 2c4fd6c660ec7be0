"""Identity of the reporting process: job, rank, world size, local rank, socket path.

Explicit arguments win over the environment. The environment is read from the variables the usual
launchers set (torchrun / torch.distributed.elastic, Slurm, or a plain RANK/WORLD_SIZE launch);
STEPWATCH_JOB overrides the job id of all of them.
"""

import os
import socket as _socket

from . import _rules

DEFAULT_SOCKET = "/run/stepwatch/agent.sock"

# Optional integer coordinates copied into every event when set.
OPTIONAL_INT_FIELDS = ("local_rank", "gpu", "dp_rank", "pp_stage", "tp_rank")


class Identity:
    """Resolved, validated identity of one reporting process."""

    __slots__ = ("job", "rank", "world_size", "socket_path") + OPTIONAL_INT_FIELDS

    def __init__(self, job, rank, world_size, socket_path, **optional):
        self.job = job
        self.rank = rank
        self.world_size = world_size
        self.socket_path = socket_path
        for name in OPTIONAL_INT_FIELDS:
            setattr(self, name, optional.get(name))

    def __repr__(self):
        fields = ", ".join(
            "%s=%r" % (name, getattr(self, name)) for name in self.__slots__
        )
        return "Identity(%s)" % fields


def _env_int(env, names):
    """First of `names` set in `env`, as an int; (None, None) when none is set."""
    for name in names:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            return int(raw.strip()), name
        except ValueError:
            raise ValueError("environment variable %s=%r is not an integer" % (name, raw))
    return None, None


def _env_job(env):
    """Job id shared by all ranks, from the launcher's environment."""
    explicit = env.get("STEPWATCH_JOB", "").strip()
    if explicit:
        return explicit
    # torchrun sets TORCHELASTIC_RUN_ID; without --rdzv-id it is the literal "none".
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id != "none":
        return run_id
    slurm = env.get("SLURM_JOB_ID", "").strip()
    if slurm:
        return "slurm-" + slurm
    # A plain launch: every rank knows the same rendezvous address.
    addr = env.get("MASTER_ADDR", "").strip()
    port = env.get("MASTER_PORT", "").strip()
    if addr and port:
        return "torch-%s-%s" % (addr, port)
    return None


def _check_int(name, value):
    """Raises ValueError when the agent would refuse `value` for the field `name`."""
    if value is None:
        return None
    error = _rules.int_error(name, value)
    if error:
        raise ValueError(error)
    return value


def resolve(job=None, rank=None, world_size=None, socket_path=None, env=None, **optional):
    """Returns an Identity from explicit values, falling back to `env` (default os.environ).

    Raises ValueError for values that are present but invalid, or that the agent would refuse
    (docs/step-event.md): a non-integer RANK, rank >= world_size, a job id that is empty, over 256
    bytes or holds a control character, an unknown keyword.
    """
    if env is None:
        env = os.environ
    unknown = set(optional) - set(OPTIONAL_INT_FIELDS)
    if unknown:
        raise ValueError("unknown identity fields: %s" % ", ".join(sorted(unknown)))

    if rank is None:
        rank, _ = _env_int(env, ("RANK", "SLURM_PROCID"))
    if world_size is None:
        world_size, _ = _env_int(env, ("WORLD_SIZE", "SLURM_NTASKS"))
    if optional.get("local_rank") is None:
        optional["local_rank"], _ = _env_int(env, ("LOCAL_RANK", "SLURM_LOCALID"))
    if rank is None:
        rank = 0
    if world_size is None:
        world_size = 1
    _check_int("world_size", world_size)
    _check_int("rank", rank)
    if rank >= world_size:
        raise ValueError("rank %d is not below world_size %d" % (rank, world_size))
    for name in OPTIONAL_INT_FIELDS:
        _check_int(name, optional.get(name))

    if job is None:
        job = _env_job(env)
    if job is None:
        if world_size > 1:
            raise ValueError(
                "cannot tell the job id of a %d-rank job: set STEPWATCH_JOB or pass job="
                % world_size
            )
        # A single process is its own job.
        job = "local-%s-%d" % (_socket.gethostname(), os.getpid())
    error = _rules.job_error(job)
    if error:
        raise ValueError(error)

    if socket_path is None:
        socket_path = env.get("STEPWATCH_SOCKET", "").strip() or DEFAULT_SOCKET
    if not isinstance(socket_path, str) or not socket_path:
        raise ValueError("socket_path must be a non-empty string, got %r" % (socket_path,))

    return Identity(job, rank, world_size, socket_path, **optional)
