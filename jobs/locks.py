"""Advisory lock keys of the project's own (bigint form): a namespace in the high bits,
then the job and a slot (a layer, or the job's final step). Migration 0007 takes the
advisory-lock functions away from ``catalog_reader``, so an analyst cannot take them; a
lock some other session takes on a small number never collides with them."""

from __future__ import annotations

LOCK_NAMESPACE = 0x6E63  # "nc"
SUMMARY_SLOT = 4095  # the slot of a job's final step; layers use 0..4094
RECONCILE_KEY = (LOCK_NAMESPACE << 40) | ((1 << 40) - 1)  # one reconciler pass at a time


def layer_lock_key(job_id: int, slot: int) -> int:
    """The bigint key of (job, layer) or, with SUMMARY_SLOT, of the job's final step."""
    if not 0 <= slot <= SUMMARY_SLOT or not 0 < job_id < 2**28 - 1:
        raise ValueError(f"no lock key for job {job_id}, slot {slot}")
    return (LOCK_NAMESPACE << 40) | (job_id << 12) | slot


def summary_lock_key(job_id: int) -> int:
    return layer_lock_key(job_id, SUMMARY_SLOT)
