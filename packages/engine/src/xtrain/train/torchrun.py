"""torchrun, as ``xtrain train --nproc N`` starts it: torch's own launcher, with a quieter failure report.

Runs ``torch.distributed.run`` with the arguments given. When a rank fails, torchrun's report (a traceback of the
launcher itself plus a table) says nothing the ranks have not said already; here the launcher's own logging is
silenced and a failure becomes one line naming the ranks and their exit codes (a rank's own output, traceback
included, still reaches the terminal). A rank's exit code 2 (a user
error it reported) is passed on as the job's exit code.

The agent dies with the launcher that started it, and tells its ranks its own pid so that they die with it
(:mod:`.lifeline`). SIGTERM or SIGINT to it is torchrun's own stop: it sends the signal on to the ranks, SIGKILLs
those still alive 30 s later, and exits here with 128 + the signal, without a traceback.
"""

from __future__ import annotations

import logging
import os
import sys

from xtrain.train.lifeline import PARENT_PID_ENV, die_with_parent_from_env


def main(argv: list[str] | None = None) -> int:
    die_with_parent_from_env()  # before torch's import, which takes seconds
    os.environ[PARENT_PID_ENV] = str(os.getpid())  # the ranks' parent: torchrun passes its environment on
    from torch.distributed.elastic.multiprocessing.api import SignalException  # noqa: PLC0415
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # noqa: PLC0415
    from torch.distributed.run import parse_args, run  # noqa: PLC0415

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))  # type: ignore[no-untyped-call]  # torch.distributed.run is untyped
    except SignalException as stopped:
        return 128 + int(stopped.sigval)
    except ChildFailedError as failed:
        codes = {rank: failure.exitcode for rank, failure in sorted(failed.failures.items())}
        if any(code == 2 for code in codes.values()):
            return 2
        listed = ", ".join(f"rank {rank}: exit code {code}" for rank, code in codes.items())
        print(f"xtrain: training failed ({listed}); see each rank's output above and RUN_DIR/logs/", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
