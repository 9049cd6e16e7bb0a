"""``dlb sim --resume`` keeps an interrupted run's streamed records only for the jobs that would make them:
a record made with another admission (or admission slowdown), retry, deadline-shed or request-timeout setting is
not this job's result."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from dlb.sim import outdir
from dlb.sim.experiments import Job, make_jobs


def _record(job: Job) -> dict:
    """The fields :func:`dlb.sim.experiments.run_job` writes that a resumed run recognises a record by."""
    return {"experiment": job.experiment, "variant": job.variant.label, "policy": job.policy, "scenario": job.scenario,
            "trial": job.trial, "duration_s": job.duration_s, "root_replicas": job.root_replicas, "code": job.code,
            "server_model": job.effective_server_model(), "timeouts": job.timeouts,
            "request_timeout_s": job.request_timeout_s, "deadline_shed": job.deadline_shed, "admission": job.admission,
            "retry": job.retry, "admission_slowdown": job.admission_slowdown}


def test_a_streamed_record_is_kept_only_for_the_settings_it_ran_with(tmp_path: Path) -> None:
    (job,) = make_jobs(["baseline"], 1, 1, 1.0, 5, ["Disc-Lat"], commit="c", code="tree", admission=True)
    others = [replace(job, admission=False), replace(job, deadline_shed=not job.deadline_shed), replace(job, retry=not job.retry),
              replace(job, request_timeout_s=job.request_timeout_s + 1), replace(job, admission_slowdown=2.0)]
    path = outdir.partial_path(tmp_path, "baseline")
    path.write_text("".join(json.dumps(_record(j)) + "\n" for j in [job, *others]))
    for j in [job, *others]:
        kept = outdir.read_partial(tmp_path, "baseline", [j], "tree")
        assert [_record(j)] == kept
