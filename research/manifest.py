"""Write research/manifest.json: every run artefact under research/ with its command, commit and sha256.

Why: the artefacts are records, not sources; the manifest says how to make each one again and lets a test
(tests/unit/test_research_manifest.py) catch a file changed or added without its entry.

Usage (from the repository root): ``python research/manifest.py`` rewrites the manifest;
``python research/manifest.py --check`` exits 1 when it is out of date.

The commit is the one the artefact records (its ``commit`` field, first record's, or ``a_commit``/``b_commit``);
artefacts that record none (plots, early files) get the commit that added them to git.
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
OUT = ROOT / "manifest.json"
ARTEFACT_SUFFIXES = (".json", ".json.gz", ".jsonl", ".png", ".txt")

#: (glob under research/, command that regenerates it), first match wins. DIR is the artefact's folder.
COMMANDS: tuple[tuple[str, str], ...] = (
    ("bench/overhead*.json", "dlb bench overhead --configs ... --json FILE (configs: see the file's rows)"),
    ("bench/overhead-64slices/probe-period-*", "for P in 1000 '' 1000 '': PROBE_MS=$P python research/tools/bench_probe_period.py "
                                                "bench overhead --configs plain root-bare-h2 root --duration 12 --slices 24 (tail of each)"),
    ("bench/overhead*.txt", "the console of the dlb bench overhead run whose --json is the .json beside it"),
    ("bench/compare*.json", "dlb demo --compare --duration 40 --json FILE"),
    ("compare-stress/probesize/recovery-ab/timings.json", ".venv/bin/python research/compare-stress/probesize/recovery_ab.py "
                                                          "OLD_OUT NEW_OUT (research/compare-stress/probesize/recovery-ab/rule.md)"),
    ("compare-stress/probesize/recovery-ab/*", "dlb demo --compare --scenarios slow-cell --policies Disc-Lat --trials 3 --duration 45 "
                                               "--no-live --out DIR, at the record's commit "
                                               "(research/compare-stress/probesize/recovery-ab/rule.md)"),
    ("compare-stress/probesize/real-twin.json", "dlb bench sim-twin --real research/compare-stress/probesize/records.jsonl "
                                                "--json FILE (research/compare-stress/probesize/README.md)"),
    ("compare-stress/probesize/*", "dlb demo --compare --scenarios steady,slow-cell --policies hub-score,Disc-Lat,Flow-Grad "
                                   "--trials 3 --duration 45 --no-live --out DIR --json DIR/summary.json "
                                   "(research/compare-stress/probesize-rule.md)"),
    ("compare-stress/slowcell/real-twin-*", "dlb bench sim-twin --real research/compare-stress/quiet-stress-f3335e8/records.jsonl "
                                            "--json FILE (research/compare-stress/slowcell/README.md)"),
    ("compare-stress/twin/real-twin-quiet-*", "dlb bench sim-twin --real research/compare-stress/quiet-453e28c/records.jsonl "
                                              "--json FILE"),
    ("compare-stress/twin/flowgrad-*", "dlb bench sim-twin --policies hub-score,Flow-Grad --json FILE"),
    ("compare-stress/quiet-stress-*/twin/*", "dlb bench sim-twin --real DIR/../records.jsonl --json FILE"),
    ("compare-stress/quiet-stress-*", "dlb demo --compare --scenarios overload,burst,slow-cell,long-prompts --policies hub-score,"
                                      "lr-global,Disc-Lat,Flow-Grad --trials 3 --duration 45 --no-live --out DIR --json DIR/summary.json "
                                      "(research/compare-stress/quiet-stress-rule.md)"),
    ("compare-stress/quiet-*", "dlb demo --compare --scenarios steady,cell-outage --policies hub-score,Disc-Lat,Flow-Grad --trials 3 "
                               "--duration 45 --out DIR --json DIR/summary.json (research/compare-stress/quiet-rule.md)"),
    ("compare-stress/twin/real-twin-*", "dlb bench sim-twin --real research/compare-stress/records.jsonl --json FILE"),
    ("compare-stress/twin/all-scenarios-*", "dlb bench sim-twin --policies Rand,MNLB,lr-global,locality-failover,hub-score,"
                                            "Disc-RIF,Disc-Lat,Disc-Grad,Flow-RIF,Flow-Lat,Flow-Grad --json FILE"),
    ("compare-stress/twin/steady-*s-*", "dlb bench sim-twin --scenarios steady --policies hub-score,Disc-Lat,Flow-Lat,Flow-Grad "
                                        "--duration D --json FILE (D in FILE's name)"),
    ("compare-stress/twin/native-discrete-fill-*", ".venv/bin/python research/compare-stress/native_tune.py twin Disc-Lat,"
                                                   "Disc-Lat-native[g=32;lb=ROUND_ROBIN],Disc-Lat-native[g=32;lb=ROUND_ROBIN;f=0.5] FILE "
                                                   "(research/native-discrete-fill-rule.md)"),
    ("compare-stress/twin/native-discrete-rr-*", ".venv/bin/python research/compare-stress/native_tune.py twin hub-score,lr-global,"
                                                 "locality-failover,Disc-RIF,Disc-Lat,Disc-Grad,Disc-RIF-native,Disc-Lat-native,"
                                                 "Disc-Grad-native,Disc-{RIF,Lat,Grad}-native[g=32;lb=ROUND_ROBIN] FILE "
                                                 "(research/native-discrete-rule.md)"),
    ("compare-stress/twin/native-discrete-*", "dlb bench sim-twin --policies hub-score,lr-global,locality-failover,Disc-RIF,Disc-Lat,"
                                              "Disc-Grad,Disc-RIF-native,Disc-Lat-native,Disc-Grad-native --json FILE"),
    ("compare-stress/coldstart/tune-twin-*", "python research/compare-stress/coldstart.py --seeds 101-103 --warmup 5,10,20 "
                                             "--twin-only --json FILE"),
    ("compare-stress/coldstart/tune-protocol-*", "python research/compare-stress/coldstart.py --seeds 101-103 --warmup 5,10,20 "
                                                 "--protocol-only --json FILE"),
    ("compare-stress/coldstart/verdict-twin-*", "python research/compare-stress/coldstart.py --seeds 301-306 --warmup 20 "
                                                "--twin-only --json FILE"),
    ("compare-stress/coldstart/verdict-protocol-*", "python research/compare-stress/coldstart.py --seeds 301-306 --warmup 20 "
                                                    "--protocol-only --json FILE"),
    ("compare-stress/coldstart/grad-verdict-twin-*", "python research/compare-stress/coldstart.py --seeds 401-406 "
                                                     "--warmup default --twin-only --json FILE"),
    ("compare-stress/coldstart/grad-verdict-protocol-*", "python research/compare-stress/coldstart.py --seeds 401-406 "
                                                         "--protocol-seed 401 --warmup default --protocol-only --json FILE"),
    ("compare-stress/native-real-*/twin.json", ".venv/bin/python research/compare-stress/native_tune.py twin "
                                              "'Disc-Lat,Disc-Lat-native[g=32;lb=ROUND_ROBIN]' FILE (research/native-discrete-real-rule.md)"),
    ("compare-stress/native-real-*", "dlb demo --compare --scenarios steady,slow-cell,overload,cell-outage --policies Disc-Lat,"
                                     "Disc-Lat-native --native-pick round-robin --trials 3 --duration 45 --out DIR (-bc68ca2: "
                                     "--scenarios cell-outage --trials 6 resuming the first run; research/native-discrete-real-rule.md)"),
    ("compare-stress/native-aversion/twin-*", "PYTHONPATH=TREE .venv/bin/python research/compare-stress/native_tune.py "
                                              "201,202,203,204,205,206 POLICIES steady,overload,slow-cell,cell-outage,burst,"
                                              "long-prompts > FILE (TREE, POLICIES: research/native-aversion-rule.md)"),
    ("compare-stress/native-aversion/real-*", "dlb demo --compare --scenarios cell-outage --policies Disc-Lat,Disc-Lat-native "
                                              "--native-pick round-robin --trials 9 --duration 45 --no-live --out DIR, resuming "
                                              "native-real-bc68ca2's records (research/native-aversion-rule.md)"),
    ("bench/native-outage-retry/*", "PYTHONPATH=TREE .venv/bin/python research/tools/native_outage_retry.py --trials 3 --json FILE "
                                    "(TREE: the commit in the file's name; research/native-discrete.md)"),
    ("compare-stress/*", "dlb demo --compare --scenarios S --policies hub-score,locality-failover,Flow-Grad --trials 3 "
                         "--duration 45 --out DIR --json FILE (research/compare-stress/README.md)"),
    ("epp/gie-run*.json", ".venv/bin/python research/epp/gie_run.py --json FILE (research/epp.md)"),
    ("epp/foreign-outlived.json", ".venv/bin/python research/epp/foreign_outlived.py --json FILE (research/epp.md)"),
    ("bench/sim-twin.json", "python -m dlb.testbed.sim_twin --trials 5 --json FILE"),
    ("bench/faults-quiet/*", "dlb bench faults --policy P --faults F --modes ext_proc --runs 3 --outage-s 25 --json FILE (P, F: the "
                             "file's command_line; detached worktree at its commit, research/operations.md)"),
    ("bench/faults*", "dlb bench faults --json FILE"),
    ("bench/loop-lag-cost*.json", "python research/tools/loop_lag_cost.py --seconds 10 --rounds 3 --json FILE (research/loop-lag.md)"),
    ("bench/starved-root-leaf-envoy*", "PYTHONPATH=<checkout> .venv/bin/python research/tools/starved_root_leaf_envoy.py --tag T "
                                       "--seed S --stall-s 0.5, seeds 21-23, main and this branch (research/operations.md)"),
    ("bench/netns-k8s/*.txt", "pytest tests/e2e/test_netns_testbed.py -s -q (the lines it prints; header: commit, load, args)"),
    ("bench/replicas/weights*.json", "python research/bench/replicas/weights.py --json FILE"),
    ("bench/hostile-squat-watch-*", "PYTHONPATH=research/tools/root_loop_watch dlb bench hostile --scale full --attacks slot-squat "
                                    "--json FILE (*-root.txt: the root's /tmp/root-loop-watch-PID.txt of that run)"),
    ("bench/hostile-squat-heartbeat-*", "dlb bench hostile --scale full --attacks slot-squat --json FILE (research/security.md)"),
    ("bench/hostile*.json", "dlb bench hostile [--tls] --json FILE"),
    ("bench/hpack-traceparent-*.txt", ".venv/bin/python research/tools/hpack_traceparent.py 21 > FILE (research/epp.md)"),
    ("bench/root-traced-service-*.txt", "research/tools/root_traced_service.py --seconds 3 --rounds 4, old (PYTHONPATH) and new "
                                        "alternated, uptime before/after each (research/epp.md) > FILE"),
    ("bench/traced-call-ir-*.txt", "valgrind --tool=callgrind .venv/bin/python research/tools/traced_call_ir.py MODE 1 and 3, "
                                   "old (PYTHONPATH) and new (research/epp.md) > FILE"),
    ("bench/h2-traced-calls-*.txt", ".venv/bin/python research/tools/h2_traced_calls.py 5, old and new alternated "
                                    "(old through PYTHONPATH; the file's first line) > FILE"),
    ("bench/xds-h2/load.txt", "written by the A/B loop (research/bench/xds-h2/RULE.md): side, time and uptime before and after each run"),
    ("bench/xds-h2/quiet-*", "dlb bench xds --streams 5000 --updates 5 --uvloop --json FILE (quiet box; research/xds.md)"),
    ("bench/xds-h2/old-*", "dlb bench xds --streams 500,2000,5000 --updates 5 --timeout 600 --uvloop --json FILE "
                          "(main at 4e40bb8; research/bench/xds-h2/RULE.md)"),
    ("bench/xds-h2/*", "dlb bench xds --streams 500,2000,5000 --updates 5 --timeout 600 --uvloop --transport h2|grpc "
                       "[--connections shared] --json FILE (research/bench/xds-h2/RULE.md)"),
    ("bench/xds-5k/*", "dlb bench xds --streams 500,2000,5000 --updates 5 --timeout 600 [--server-gc python] [--uvloop] --json FILE "
                       "(old* at c8630a9 with --server-gc python, new-1/2 at 811ab08, new-3 and gc-* (--streams 5000) at 1eb3bde; research/xds.md)"),
    ("bench/load.json", "dlb bench load --duration 20 --json FILE"),
    ("bfio/bench.json", "dlb bfio bench --picks 5000 --json FILE"),
    ("bfio/dataplane-c7/bench-*.json", "dlb bfio bench --picks 5000 --json FILE"),
    ("bfio/dataplane-c7/log.txt", "written by the C7 run script (research/bfio.md, C7): time and load per seed"),
    ("bfio/dataplane-c8/bench-*.json", "dlb bfio bench --picks 5000 --json FILE"),
    ("bfio/dataplane-c8/log.txt", "written by the C8 run script (research/bfio.md, C8): time, load and commit per run"),
    ("bfio/dataplane-c8/*.txt", "the lines dlb bfio dataplane ARGS prints (ARGS: research/bfio.md, C8 rule)"),
    ("bfio/dataplane-c9/bench-*.json", "dlb bfio bench --picks 5000 --json FILE"),
    ("bfio/dataplane-c9/heldrun-*.json", "dlb bfio heldrun ARGS --json FILE (ARGS: the file's args field)"),
    ("bfio/dataplane-c9/log.txt", "written by the C9 run loop (research/bfio.md, C9): time, load and commit per run"),
    ("bfio/dataplane-c9/*.txt", "the lines dlb bfio dataplane ARGS prints (ARGS: research/bfio.md, C9 rule)"),
    ("bfio/dataplane-c10/heldrun-*.json", "dlb bfio heldrun ARGS --json FILE (ARGS: the file's args field)"),
    ("bfio/dataplane-c10/heldrun-*.txt", "the lines dlb bfio heldrun ARGS prints (ARGS: the matching .json's args field)"),
    ("bfio/dataplane-c10/log.txt", "written by run-loop.sh (research/bfio.md, C10): time, load and commit per run"),
    ("bfio/dataplane-c10/uptime.txt", "/proc/loadavg every 30 s beside the C10 runs (research/bfio.md, C10)"),
    ("bfio/dataplane-c10/run-loop.sh", "the C10 run loop itself (research/bfio.md, C10 rule), run from a detached worktree"),
    ("bfio/dataplane-c10/verdict.json", "python research/bfio/dataplane_verdict.py research/bfio/dataplane-c10 --json FILE"),
    ("bfio/dataplane-c10/*.txt", "the lines dlb bfio dataplane ARGS prints (ARGS: research/bfio.md, C10 rule)"),
    ("bfio/stream-tokens/bench.json", "dlb bfio bench --picks 5000 --json FILE"),
    ("bfio/stream-tokens/log.txt", "written by the stream-token run loop (research/bfio.md, stream tokens): time, load, commit per run"),
    ("bfio/stream-tokens/*.json", "dlb bfio dataplane ARGS --json FILE (ARGS: the file's args field)"),
    ("bfio/heldrun-*.json", "dlb bfio heldrun ARGS --json FILE (ARGS: the file's args field)"),
    ("bfio/study-*.json", "dlb bfio study ARGS --json FILE (ARGS: the file's args field)"),
    ("bfio/placement-*.json", "dlb bfio placement ARGS --json FILE (ARGS: the file's args field)"),
    ("bfio/dataplane*.json", "dlb bfio dataplane ARGS --json FILE (ARGS: the file's args field)"),
    ("bfio/dataplane*.txt", "the lines dlb bfio dataplane ARGS prints (ARGS: research/bfio.md, C6)"),
    ("bfio/placement.json", "dlb bfio placement --json FILE"),
    ("bfio/study.json*", "dlb bfio study --milp --json FILE --plots research/img"),
    ("img/bfio_*.png", "dlb bfio study --milp --json research/bfio/study.json --plots research/img"),
    ("sim/issue-11/theory-scale*", "dlb theory --json FILE (sizes and policies: research/sim/issue-11/README.md)"),
    ("sim/theory-load/flow-grad-1800s-*", "dlb theory --sizes 10,12 --graphs complete --load 0.85,0.95 --policies Flow-Grad "
                                          "--replicas 1 --noise 0 --jobs 1 --horizon 1800 --json FILE"),
    ("sim/theory-load/flow-grad-rho995-*", "python research/tools/theory_grad_cap.py 0.995 --sizes 10,12 --graphs complete "
                                           "--load 0.85,0.95 --policies Flow-Grad --replicas 1 --noise 0 --jobs 1 --json FILE"),
    ("sim/theory-load/relaxation-600s-*", "dlb theory --sizes 2,6,10,12 --graphs complete --load 0.85,0.95 --policies Flow-Grad "
                                          "--replicas 1 --noise 0 --jobs 1 --rule relaxation --json FILE"),
    ("routing-stress/deadline-31/*", "dlb sim --experiment outage --scenarios 3 (util95-*: --experiment utilization --variants util=0.95 "
                                     "--scenarios 1) --seed 31 --trials 1 --policies Rand,lr-global,Disc-RIF,Disc-Lat,Flow-Grad "
                                     "--deadline-shed off|on --workers 1 --out DIR (tuning seed; research/routing-stress/deadline-shed.md)"),
    ("routing-stress/deadline-43/*", "dlb sim --experiment outage|baseline --seed 43 --deadline-shed off|on --workers 1 --in-order "
                                     "--out DIR (policies and sizes: research/routing-stress/deadline-shed-rule.md)"),
    ("routing-stress/flow-two-choice/diag-*", "python research/routing-stress/flowpick_diag.py --seeds 101,102,103 --policies "
                                              "\"Disc-Lat;lr-global;Flow-Grad;Flow-Grad[pick=two-choice];Flow-Lat;Flow-Lat[pick=two-choice]\" "
                                              "--json FILE (research/routing-stress/flow-two-choice.md)"),
    ("routing-stress/flow-two-choice/bench-pick-*", "dlb bench pick, minimum of five runs per row, HEAD's dlb/ on PYTHONPATH for "
                                                    "*-head-* (research/routing-stress/flow-two-choice.md)"),
    ("routing-stress/flow-two-choice/verdict-*", "python research/routing-stress/flowpick_verdict.py research/routing-stress/flow-two-choice "
                                                 "--json FILE"),
    ("routing-stress/flow-two-choice-extra/*", "python research/routing-stress/flowpick_sim.py sim --experiment utilization --variants "
                                               "util=0.95 --server-model pipeline (pipeline95) | --experiment baseline --root-replicas 4 "
                                               "(baseline-r4) --seed 67 --scenarios 3 --trials 1 --minutes 4 --workers 1 --in-order "
                                               "--policies ... --out DIR (research/routing-stress/flow-two-choice.md)"),
    ("routing-stress/flow-two-choice/*", "python research/routing-stress/flowpick_sim.py sim --experiment baseline|burst|utilization "
                                         "[--variants util=0.95] --seed 67 --scenarios 5 --trials 1 --minutes 4 --workers 1 --in-order "
                                         "--policies ... --out DIR (research/routing-stress/flow-two-choice-rule.md)"),
    ("routing-stress/admission-31/*", "python research/routing-stress/admit_diag.py SCENARIO POLICY [admission=true "
                                      "admission_fraction=F] [outage=false], one line per run (tuning seed; "
                                      "research/routing-stress/admission.md)"),
    ("routing-stress/admission-89/burst-*", "dlb sim --experiment burst --seed 89 --scenarios 5 --trials 1 --workers 1 --in-order "
                                            "--policies Rand,lr-global,Disc-RIF,Disc-Lat,Flow-Grad --admission off|on --out DIR "
                                            "(research/routing-stress/admission-stress-rule.md)"),
    ("routing-stress/admission-89/util-*", "dlb sim --experiment utilization --seed 89 --scenarios 1 --trials 1 --workers 1 --in-order "
                                           "--policies Rand,lr-global,Disc-RIF,Disc-Lat,Flow-Grad --admission off|on --out DIR "
                                           "(research/routing-stress/admission-stress-rule.md)"),
    ("routing-stress/status-103/*", "dlb sim --experiment E --seed 103 --scenarios 1 --trials 1 --workers 2 --policies "
                                    "Rand,lr-global,locality-failover,hub-score,Disc-RIF,Disc-Lat,Flow-Grad --out DIR/E "
                                    "(research/routing-stress/status-103-rule.md)"),
    ("routing-stress/status-103.json", "python research/routing-stress/status_table.py status-103/utilization status-103/length "
                                       "status-103/homogeneous status-103/noise status-103/server-model --json FILE"),
    ("routing-stress/admission-fraction-31/*", "python research/routing-stress/admission_fraction_probe.py OUT.jsonl "
                                               "(tuning seed 31, exploratory; research/routing-stress/status-103.md)"),
    ("routing-stress/admission-slowdown-31/*", "python research/routing-stress/admission_slowdown_probe.py OUT.jsonl [SLOWDOWNS] "
                                                "(tuning seed 31, exploratory; research/routing-stress/admission-floor-rule.md)"),
    ("routing-stress/admission-floor-107/*", "dlb sim --experiment E --seed 107 --scenarios 2 --trials 1 --workers 2 "
                                             "--admission-slowdown 0|2 --policies P --out DIR "
                                             "(E and P: research/routing-stress/admission-floor-rule.md)"),
    ("routing-stress/admission-floorcap-tuning/*", "python research/routing-stress/admission_floorcap_probe.py OUT.jsonl [CAPS] "
                                                   "(tuning seeds 31 and 107, exploratory; "
                                                   "research/routing-stress/admission-floorcap-rule.md)"),
    ("routing-stress/admission-floorcap-109/*", "dlb sim --experiment E --seed 109 --scenarios 2 --trials 1 --workers 2 "
                                                "--admission-slowdown 0|2 --policies P --variants V --out DIR "
                                                "(E, V and P: research/routing-stress/admission-floorcap-rule.md)"),
    ("routing-stress/admission-slowdown3-113/*", "dlb sim --experiment E --seed 113 --scenarios 2 --trials 1 --workers 2 "
                                                 "--admission-slowdown 0|3 --policies P --variants V --out DIR "
                                                 "(E, V and P: research/routing-stress/admission-slowdown3-rule.md)"),
    ("routing-stress/censored-prior-127/*", "dlb sim --experiment length --variants y=1/10,y=1/4 --admission-slowdown 3 "
                                            "--seed 127 --scenarios 2 --trials 1 --workers 2 --policies P --out DIR, off at "
                                            "572bbbd and on at 77c7bbd (P: research/routing-stress/censored-prior-rule.md)"),
    ("routing-stress/censored-prior-131/*", "dlb sim --experiment E --seed 131 --scenarios 2 --trials 1 --workers 2 --policies P "
                                            "--out DIR, off at 31baccc, on at b5ce4a2, A/A through research/routing-stress/aa_dither.py "
                                            "at 31baccc (E, V and P: research/routing-stress/censored-prior-131-rule.md)"),
    ("routing-stress/censored-prior-verdict*.json", "python research/routing-stress/censored_prior_verdict.py [--aa] NAME OFF ON "
                                                    "[AA] ... --json FILE (research/routing-stress/censored-prior-rule.md, "
                                                    "censored-prior-131-rule.md)"),
    ("routing-stress/admission-floor-verdict*.json", "python research/routing-stress/admission_floor_verdict.py NAME OFF ON ... "
                                                     "--json FILE (research/routing-stress/admission-floor-rule.md, "
                                                     "admission-floorcap-rule.md, admission-slowdown3-rule.md)"),
    ("routing-stress/retry-97/*", "dlb sim --experiment E --seed 97 --scenarios S --trials 1 --workers 2 --retry off|on "
                                  "--policies P --out DIR (E, S and P: research/routing-stress/retry-rule.md)"),
    ("routing-stress/retry-verdict*.json", "python research/routing-stress/retry_verdict.py burst OFF ON utilization OFF ON "
                                           "outage OFF ON --baseline OFF ON --json FILE (research/routing-stress/retry-rule.md)"),
    ("routing-stress/admission-stress-verdict*.json", "python research/routing-stress/admission_stress_verdict.py burst BURST_OFF BURST_ON "
                                                      "utilization UTIL_OFF UTIL_ON --json FILE"),
    ("routing-stress/admission-89/*", "dlb sim --experiment outage|baseline --seed 89 --admission off|on --workers 1 --in-order "
                                      "--out DIR (policies and sizes: research/routing-stress/admission-rule.md)"),
    ("routing-stress/admission-verdict*.json", "python research/routing-stress/admission_verdict.py OUTAGE_OFF OUTAGE_ON "
                                               "BASELINE_OFF BASELINE_ON --json FILE"),
    ("routing-stress/deadline-verdict*.json", "python research/routing-stress/deadline_verdict.py OFF_DIR ON_DIR --json FILE"),
    ("routing-stress/timeout-31/*", "dlb sim --experiment outage --seed 31 --scenarios 1 --trials 1 --timeouts cancel --workers 1 "
                                    "--in-order --policies Rand,lr-global,hub-score,Disc-RIF,... --out DIR (exploration, stopped "
                                    "after 4 runs; research/routing-stress/timeout-cancel.md)"),
    ("routing-stress/timeout-71/*", "dlb sim --experiment outage --seed 71 --timeouts cancel|serve --workers 1 --in-order --out DIR "
                                    "(policies and sizes: research/routing-stress/timeout-cancel-rule.md)"),
    ("routing-stress/timeout-speed*.jsonl", "python research/routing-stress/timeout_speed.py Disc-Lat|lr-global [cancel|serve] "
                                           "(no mode: PYTHONPATH=old dlb/ at a71bdb9), twice each, alternating"),
    ("routing-stress/timeout-verdict*.json", "python research/routing-stress/timeout_verdict.py CANCEL_DIR [SERVE_DIR] --json FILE"),
    ("routing-stress/*-lagdiag-*.json", "python research/routing-stress/probe.py --seeds 9701,9702,9703 --util 0.95 --minutes 4 "
                                        "--model batched --workers 2 --policies 'Rand;Flow-Lat;Flow-Grad;Flow-Lat[lead_gain=1];"
                                        "Flow-Grad[lead_gain=1]' --json FILE"),
    ("routing-stress/*-lag2-*.json", "python research/routing-stress/probe.py --seeds 5821,5822,5823,5825,5834,5835 --util U "
                                     "--minutes 4 --model M --workers 2 --policies ... --json FILE (research/routing-stress/lag-rule.md)"),
    ("routing-stress/*-lag-*.json", "python research/routing-stress/probe.py --seeds 5811,5812,5813 --util U --minutes 4 --model M "
                                    "--workers 2 --policies ... --json FILE (research/routing-stress/lag-rule.md)"),
    ("routing-stress/*smooth*.json", "python research/routing-stress/probe.py --seeds S --util U --minutes 4 --model batched "
                                     "--policies P --json FILE (S, U, P: README, 'Smooth weighted round robin')"),
    ("sim/theory-load/default-600s-*", "dlb theory --sizes 2,6,10,12 --graphs complete --load 0.85,0.95 --policies Flow-Grad "
                                       "--replicas 1 --noise 0 --jobs 1 --json FILE"),
    ("sim/theory-load/flow-grad-*", "dlb theory --sizes 2,6,10,12 --graphs complete --load 0.85,0.95 --policies Flow-Grad "
                                    "--replicas 1 --noise 0 --jobs 1 --json FILE"),
    ("sim/theory-load/targets-delay-only*", "dlb theory --sizes 2,6,10,12 --graphs complete --load 0.85,0.95 "
     "--policies Flow-Grad --replicas 1 --noise 0 --rule delay-only --jobs 1 --json FILE"),
    ("sim/theory-load/targets*", "dlb theory --sizes 2,6,10,12 --graphs complete --load 0.85,0.95 "
     "--policies Flow-Grad --replicas 1 --noise 0 --rule relaxation --jobs 1 --json FILE"),
    ("sim/theory-load/default-rule*", "dlb theory --sizes 2,6,10,12 --graphs complete --load 0.85,0.95 "
     "--policies Flow-Grad,Flow-Lat --replicas 1,4 --noise 0 --jobs 1 --json FILE"),
    ("sim/theory-load/dynamics*", "dlb theory --set dynamics --policies Flow-Grad,Flow-Lat --replicas 1 --noise 0 --jobs 1 --json FILE"),
    ("sim/shedding/*.json", "python research/sim/shedding/overload.py --minutes 5 --scenarios 4"),
    ("routing-stress/*ideal*.json", "python research/routing-stress/oracle.py --seeds 9401,9402,9403,9404,9405,9406 "
                                     "--util 0.8 --minutes 4 --json FILE (at the commit in FILE's name)"),
    ("routing-stress/*gradfloor-tuning*.json", "python research/routing-stress/probe.py --seeds 101,102,103 --util 0.8 "
                                               "--minutes 4 --model batched --policies P --json FILE (P: README, 'A floor from "
                                               "the models' spread')"),
    ("routing-stress/*rho*-tuning-*.json", "python research/routing-stress/probe.py --seeds 101,102,103 --util 0.8 --minutes 4 "
                                           "--model batched --policies Rand,Disc-Grad,Flow-Grad --grad-max-rho R --json FILE "
                                           "(R in FILE's name: rho95 = 0.95, rho99 = 0.99)"),
    ("routing-stress/*.json", "python research/routing-stress/probe.py --seeds 7001,7002,7003 --minutes 4 --util 0.95 "
                               "--model pipeline --workers 1 --json FILE (at the commit in FILE's name)"),
    ("sim/speed-s3-12/*.json", "python research/sim/speed-s3-12/ab.py TREE_A TREE_B MINUTES REPEAT FILE"),
    ("sim/speed-f2d3554/*.json", "PYTHONPATH=TREE python research/sim/speed-f2d3554/bench.py time MINUTES FILE"),
    ("sim/speed-batched-engine/ab-*.json", "python research/sim/speed-batched-engine/ab.py TREE_A TREE_B 3 FILE"),
    ("sim/speed-batched-engine/*/cost-estimate.json", "PYTHONPATH=TREE python -m dlb sim --experiment all --estimate 2 "
                                                      "--out DIR (research/sim/speed-batched-engine/README.md)"),
    ("sim/speed-s4/*/cost-estimate.json", "PYTHONPATH=TREE python -m dlb sim --experiment baseline --experiment utilization "
                                         "--experiment length --experiment noise --estimate 0.5 --out DIR "
                                         "(research/sim/speed-s4/README.md)"),
    ("sim/*cost*/cost-estimate.json", "dlb sim --experiment all --estimate 0.5 --out DIR"),
    ("sim/protocol-head/*", "dlb sim --experiment EXPERIMENT --seed 13 --workers 1 --in-order --out DIR, then dlb sim report "
                            "(research/sim/protocol-head/README.md)"),
    ("sim/probe-watch-137/*", "dlb sim --experiment outage --experiment priors --scenarios 6 --trials 2 --policies "
     "Rand,Disc-Lat,Disc-Grad,Flow-Grad --server-model batched --seed 137 --out DIR (at the commit in the folder's name)"),
    ("sim/priors*/*", "dlb sim --experiment priors --scenarios 5 --trials 2 --minutes 3 --out DIR"),
    ("sim/plots/*.png", "dlb sim report --results research/sim/protocol/results.json.gz --output research/paper-reproduction.md "
                     "--plots-dir research/sim/plots --analysis research/sim/analysis.md"),
    ("sim/issue-11/plots-*/*.png", "dlb sim report --results DIR/results.json.gz --plots-dir FILE's folder"),
    ("sim/*/*.png", "dlb sim --experiment EXPERIMENT --out DIR (plots written next to results.json)"),
    ("sim/*", "dlb sim --experiment EXPERIMENT --seed 5 --out DIR (settings: DIR's benchmark.json)"),
)


def artefacts() -> list[Path]:
    """Every artefact file under research/ (the manifest itself excluded), sorted."""
    return sorted(p for p in ROOT.rglob("*") if p.is_file() and p != OUT and p.name.endswith(ARTEFACT_SUFFIXES))


def command_for(rel: str) -> str:
    for pattern, cmd in COMMANDS:
        if fnmatch.fnmatch(rel, pattern):
            return cmd
    raise ValueError(f"no regenerating command known for research/{rel}: add a row to COMMANDS")


def recorded_commit(path: Path) -> str | None:
    """The commit the artefact itself records, if it is JSON and records one."""
    if not path.name.endswith((".json", ".json.gz", ".jsonl")):
        return None
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode()
    try:
        data: Any = json.loads(text.splitlines()[0] if path.suffix == ".jsonl" else text)
    except (json.JSONDecodeError, IndexError):
        return None
    if isinstance(data, list) and data:
        data = data[0]
    if not isinstance(data, dict):
        return None
    for key in ("commit", "a_commit"):
        if isinstance(data.get(key), str):
            return str(data[key])
    return None


def added_commit(path: Path) -> str:
    """The commit that first added the file (following renames), for artefacts that record none.

    A ``.gz`` is a new blob, so its history is that of the uncompressed file it replaced (which lived
    under docs/ before research/ existed).
    """
    rel = path.relative_to(ROOT).as_posix()
    plain = rel.removesuffix(".gz")
    for candidate in (f"research/{rel}", f"research/{plain}", f"docs/{plain}"):
        out = subprocess.run(["git", "log", "--follow", "--diff-filter=A", "--format=%H", "--", candidate],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
        if out:
            return out[-1]
    return "uncommitted"


def entry(path: Path) -> dict[str, str | int]:
    rel = path.relative_to(ROOT).as_posix()
    commit = recorded_commit(path)
    return {
        "path": f"research/{rel}",
        "bytes": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "commit": commit or added_commit(path),
        "commit_source": "recorded in the artefact" if commit else "git commit that added the file",
        "command": command_for(rel),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if research/manifest.json is out of date")
    args = ap.parse_args(argv)
    text = json.dumps([entry(p) for p in artefacts()], indent=1) + "\n"
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print("manifest up to date" if same else "manifest out of date: run python research/manifest.py")
        return 0 if same else 1
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
