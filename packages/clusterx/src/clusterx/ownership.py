"""Who may change a job: the rule the daemon enforces on its socket (with the caller's SO_PEERCRED uid) and the
client applies where no daemon is involved. Stdlib only.

- cancel, and change (priority): the job's owner (the `user` who submitted it), root, or the owner of the daemon
  that runs it (it runs the job's processes as itself, so it can stop them anyway);
- submit and retry: root or the daemon's owner only, because the daemon runs every job as its own user.
"""

from __future__ import annotations

import pwd

ROOT_UID = 0


def user_name(uid: int) -> str:
    """The login name of `uid` ('uid N' when the system knows no name for it)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def may_change(caller_uid: int, job_owner: str, daemon_uid: int | None = None) -> bool:
    """May the process of `caller_uid` cancel or change a job that `job_owner` submitted?"""
    return caller_uid in (ROOT_UID, daemon_uid) or user_name(caller_uid) == job_owner


def not_owner_message(job_id: int, job_owner: str, action: str, caller: str, daemon_owner: str | None = None) -> str:
    """The refusal, naming who owns the job and who else may act on it."""
    others = f"root or this daemon's owner ({daemon_owner})" if daemon_owner else "root"
    return f"job {job_id} belongs to {job_owner}; {caller} may not {action} it (only {job_owner}, {others} may)"


def runner_only_message(action: str, caller: str, daemon_owner: str) -> str:
    return (
        f"this daemon runs jobs as {daemon_owner}; {caller} may not {action} through it (only {daemon_owner} or "
        "root may): use your own daemon (your own database)"
    )
