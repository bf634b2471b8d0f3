"""The report's tf.data service section: whether more data workers would help (pure)."""

from __future__ import annotations

from types import SimpleNamespace

from ddlctl.report.dataservice import advice, data_service_section, service_rows
from ddlctl.report.diagnosis import diagnosis_lines

WORKERS = [{"task": "dispatcher:0", "host": "d1", "cpu_mean": 3.0, "restarts": 0},
           {"task": "data:0", "host": "d1", "cpu_mean": 97.0, "restarts": 1},
           {"task": "data:1", "host": "d2", "cpu_mean": 92.0, "restarts": 0}]
HUNGRY = [{"task": "worker:0", "input_fraction": 0.42, "samples_per_s": 900.0},
          {"task": "worker:1", "input_fraction": 0.1, "samples_per_s": 950.0}]


def test_more_data_hosts_more_data_workers_or_neither_by_what_is_busy():
    busy_hosts = advice(WORKERS, HUNGRY, {"d1": 97.0, "d2": 90.0}, 0.3)
    assert busy_hosts == ("the trainers wait for input (worker:0 42% of each step) and the data hosts are busy (CPU "
                          "d1 97%, d2 90%): more data hosts (roles=data) would help")
    spare = advice(WORKERS, HUNGRY, {"d1": 40.0, "d2": 90.0}, 0.3)
    assert spare.endswith("each of the 2 data worker(s) keeps 0.9-1.0 cores busy, with CPU to spare on their hosts: "
                          "more data workers (--data-workers N, or slots= on the data hosts) would help")
    idle = [{**w, "cpu_mean": 30.0} for w in WORKERS]
    assert advice(idle, HUNGRY, {"d1": 40.0}, 0.3).endswith(
        "but the data workers are not busy (0.3-0.3 cores each): more would not help; the batches' way to the "
        "trainers is the bound (the network, or the trainers' own CPU taking them in)")
    assert advice(WORKERS, [{**t, "input_fraction": 0.05} for t in HUNGRY], {"d1": 99.0}, 0.3) is None


def test_the_section_from_a_plan_its_outcome_and_figures_and_the_diagnosis_line_it_gives():
    plan = {"tasks": [{"name": "worker:0", "host": "t", "role": "worker"},
                      {"name": "dispatcher:0", "host": "d1", "role": "dispatcher"},
                      {"name": "data:0", "host": "d1", "role": "data"}]}
    outcome = {"tasks": [{"name": "data:0", "restarts": 2}]}
    tasks = [SimpleNamespace(name="worker:0", host="t", input_fraction=0.5, samples_per_s=1200.0)]
    hosts = [SimpleNamespace(host="d1", cpu_util_mean=95.0), SimpleNamespace(host="t", cpu_util_mean=20.0)]
    section = data_service_section(plan, outcome, {"data:0": ([90.0, 100.0],)}, tasks, hosts, 0.3)
    assert section["workers"] == [{"task": "dispatcher:0", "host": "d1", "cpu_mean": None, "restarts": 0},
                                  {"task": "data:0", "host": "d1", "cpu_mean": 95.0, "restarts": 2}]
    assert section["data_hosts_cpu"] == {"d1": 95.0} and "more data hosts (roles=data) would help" in section["advice"]
    assert service_rows(section) == [("dispatcher:0", "d1", "-", "0 restart(s)"),
                                     ("data:0", "d1", "0.95 cores", "2 restart(s)"),
                                     ("worker:0", "t", "waits 50% for input", "1,200 samples/s")]
    assert data_service_section({"tasks": plan["tasks"][:1]}, outcome, {}, tasks, hosts, 0.3) is None
    summary = SimpleNamespace(total_steps=10, tasks_count=3, tasks=[SimpleNamespace(
        name="worker:0", host="t", input_fraction=0.5, state="succeeded", total_steps_declared=None, straggler=False,
        cpu_mean=None, kernel_cpu_mean=None)], hosts=[], work=[], data_service=section, traces=None, degraded=(),
        hosts_lost=(), restarts=(), balance=None, membership=(), strategy="mwms", attempts=None)
    lines = diagnosis_lines(summary, {})
    assert [line for line in lines if line.startswith("input-bound")] == [
        f"input-bound through the tf.data service: {section['advice']}"]
