#!/usr/bin/python3
"""Self-test of scripts/vflow-report on synthetic metrics files.

The files use the records MetricsObserver writes (src/engine/observers.cpp).

    /usr/bin/python3 tests/scripts/test_vflow_report.py
"""
import json
import os
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "vflow-report")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOTS = ("loss.png", "accuracy.png", "eval_loss.png", "throughput.png")


def step_record(step, loss):
    return {"event": "step", "step": step, "epoch": step // 20,
            "loss": loss, "lr": 0.1, "examples_per_second": 1000.0,
            "compute_ms": 15.0, "sync_ms": 3.0, "update_ms": 2.0,
            "workers": 2, "time": 1700000000.0 + step * 0.02}


def metrics_lines(final_loss, accuracies, fingerprint, steps=50, every=5):
    """The lines of one run: a step record every `every` steps (20 ms per
    step, 1000 examples/s) whose loss falls to `final_loss`, evaluations
    with `accuracies` (loss 1 - accuracy) at equal intervals, an end
    record."""
    eval_at = {steps * (i + 1) // len(accuracies): accuracy
               for i, accuracy in enumerate(accuracies)}
    records = []
    for step in range(every, steps + 1, every):
        records.append(step_record(step, final_loss + 0.02 * (steps - step)))
        if step in eval_at:
            records.append({"event": "eval", "step": step,
                            "accuracy": eval_at[step],
                            "loss": 1 - eval_at[step], "examples": 1024})
    records.append({"event": "end", "step": steps,
                    "fingerprint": fingerprint})
    return [json.dumps(r, separators=(",", ":")) for r in records]


def table_rows(summary):
    """The data rows of summary.md's table, as lists of cells."""
    rows = [line.strip().strip("|").split("|")
            for line in summary.splitlines() if line.startswith("|")]
    return [[c.strip() for c in row] for row in rows[2:]]


class VflowReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.out = os.path.join(self.dir, "report")

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, lines, newline_at_end=True):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write("\n".join(lines) + ("\n" if newline_at_end else ""))
        return path

    def report(self, *args):
        return subprocess.run([SCRIPT, *args], capture_output=True,
                              text=True, timeout=120)

    def test_script_is_executable(self):
        self.assertTrue(os.access(SCRIPT, os.X_OK), SCRIPT)

    def test_two_runs(self):
        a = self.write("a.jsonl", metrics_lines(0.25, [0.5, 0.8125],
                                                "00000000000000aa"))
        b = self.write("b.jsonl", metrics_lines(0.5, [0.25, 0.75],
                                                "00000000000000bb"))
        result = self.report(a, b, "--out", self.out, "--labels",
                             "first,second", "--title", "test", "--smooth",
                             "3")
        self.assertEqual(result.returncode, 0, result.stderr)
        for name in PLOTS:
            path = os.path.join(self.out, name)
            self.assertIn(path, result.stdout.splitlines())
            with open(path, "rb") as f:
                self.assertEqual(f.read(8), PNG_SIGNATURE, name)
        with open(os.path.join(self.out, "summary.md")) as f:
            rows = table_rows(f.read())
        # run, steps, train loss, eval accuracy, eval loss, examples/s,
        # training s (50 steps x 20 ms), fingerprint
        self.assertEqual(rows, [
            ["first", "50", "0.25", "81.25%", "0.1875", "1000.0", "1.00",
             "`00000000000000aa`"],
            ["second", "50", "0.5", "75.00%", "0.25", "1000.0", "1.00",
             "`00000000000000bb`"],
        ])

    def test_default_labels_are_file_stems(self):
        a = self.write("run-a.jsonl", metrics_lines(0.25, [0.5], "aa"))
        result = self.report(a, "--out", self.out)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(self.out, "summary.md")) as f:
            self.assertEqual(table_rows(f.read())[0][0], "run-a")

    def test_malformed_line(self):
        lines = metrics_lines(0.25, [0.5], "aa")
        lines[2] = '{"event":"step","step":15,"loss":'
        path = self.write("bad.jsonl", lines)
        result = self.report(path, "--out", self.out)
        self.assertEqual(result.returncode, 2)
        self.assertIn(f"{path}:3:", result.stderr)
        self.assertIn("not JSON", result.stderr)

    def test_missing_file(self):
        path = os.path.join(self.dir, "missing.jsonl")
        result = self.report(path, "--out", self.out)
        self.assertEqual(result.returncode, 2)
        self.assertIn(path, result.stderr)

    def test_no_step_records(self):
        path = self.write("evals.jsonl", [
            '{"event":"eval","step":10,"accuracy":0.5,"loss":1.0}'])
        result = self.report(path, "--out", self.out)
        self.assertEqual(result.returncode, 2)
        self.assertIn("no step records", result.stderr)

    def test_unknown_event_is_skipped_with_warning(self):
        lines = metrics_lines(0.25, [0.5], "aa")
        lines.insert(1, '{"event":"future","step":7}')
        path = self.write("extra.jsonl", lines)
        result = self.report(path, "--out", self.out)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"{path}:2:", result.stderr)
        self.assertIn("warning", result.stderr)

    def test_non_finite_loss_as_the_engine_writes_it(self):
        # fmt's {:.6g} writes a diverged loss as nan or -nan (not JSON).
        lines = metrics_lines(0.25, [0.5], "aa")
        last = max(i for i, line in enumerate(lines) if '"step",' in line)
        lines[last] = lines[last].replace('"loss":0.25,', '"loss":-nan,')
        self.assertIn("-nan", lines[last])
        path = self.write("diverged.jsonl", lines)
        result = self.report(path, "--out", self.out)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(self.out, "summary.md")) as f:
            self.assertEqual(table_rows(f.read())[0][2], "nan")

    def test_incomplete_last_line_is_skipped(self):
        lines = metrics_lines(0.25, [0.5], "aa")
        lines.append('{"event":"step","step":55,"lo')
        path = self.write("live.jsonl", lines, newline_at_end=False)
        result = self.report(path, "--out", self.out)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"{path}:{len(lines)}:", result.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
