#!/usr/bin/env python3
"""Self-check for tools/plot.py on the synthetic results in tools/testdata/.

Plain Python, no pytest: `python3 tools/test_plot.py` exits non-zero on the first failure.
Needs matplotlib, like plot.py itself.

The fixtures are fake but shaped like the real files, with the awkward cases built in: an
aggregate entry with an absurd time, failed runs (a stage over its time budget, a peer refusing
GQA), and a stage with a shape missing altogether.
"""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ left in tools/ by a check

import plot  # noqa: E402

TESTDATA = os.path.join(HERE, "testdata")
README_BEFORE = "# Attention\n\nIntro text.\n\n"
README_AFTER = "\n\n## Build\n\nMore text.\n"
README = (README_BEFORE + plot.BEGIN_MARKER + "\nstale table\n" + plot.END_MARKER + README_AFTER)


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def fixture_stages():
    with open(os.path.join(TESTDATA, "bench.json"), encoding="utf-8") as f:
        names = [b["name"] for b in json.load(f)["benchmarks"]]
    return sorted({name.split("/", 1)[0] for name in names})


def table_rows(readme_text):
    """{first cell: [cells]} for the rows of the generated table."""
    rows = {}
    for line in readme_text.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return rows


def run_plot(workdir, results_dir):
    png = os.path.join(workdir, "docs", "progression.png")
    readme = os.path.join(workdir, "README.md")
    # plot.py prints the table and notes; keep the check's own output to its verdict.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        plot.main(["--results", results_dir, "--png", png, "--readme", readme])
    with open(readme, encoding="utf-8") as f:
        return png, f.read()


def check_png(png):
    check(os.path.exists(png), f"{png} was not written")
    with open(png, "rb") as f:
        check(f.read(8) == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG")
    check(os.path.getsize(png) > 20_000, f"{png} is suspiciously small")


def test_full_results(workdir):
    """Both files, sweep entries present (the 2x3 layout)."""
    with open(os.path.join(workdir, "README.md"), "w", encoding="utf-8") as f:
        f.write(README)
    png, text = run_plot(workdir, TESTDATA)
    check_png(png)

    check(text.startswith(README_BEFORE + plot.BEGIN_MARKER), "text before the table changed")
    check(text.endswith(plot.END_MARKER + README_AFTER), "text after the table changed")
    check("stale table" not in text, "the old table was not replaced")
    check("![progression](docs/progression.png)" in text, "image link missing or not relative")
    check("Measured on NVIDIA H200 (fixture), driver 570.00, CUDA 12.8, PyTorch 2.11.0+cu128"
          in text, "footer line missing or wrong")

    rows = table_rows(text)
    expected = fixture_stages() + ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn"]
    check(list(rows) == expected, f"table rows {list(rows)} != {expected}")
    check(all(len(cells) == 7 for cells in rows.values()), "a row does not have 7 cells")

    # 04_wmma has no decode_b8_sk32768 entry at all; sdpa_efficient only failed entries for decode;
    # 01_naive's seed has an aggregate of 1e6 µs next to the real 9.6 µs.
    check(rows["04_wmma"][6] == plot.MISSING,
          f"missing entry not shown as a dash: {rows['04_wmma']}")
    check(rows["sdpa_efficient"][5] == plot.MISSING, "a failed run was not shown as a dash")
    check(rows["sdpa_cudnn"][5] == plot.MISSING, "a failed run was not shown as a dash")
    check(rows["01_naive"][2].startswith("9.60 ("), f"aggregate not ignored: {rows['01_naive'][2]}")
    check(rows["sdpa_flash"][2].endswith("(1.00× FA2)"), "FA2 is not 1.00× itself")
    check(rows["01_naive"][1] == "one warp per query row, online softmax, fp32 CUDA cores",
          "stage description not taken from the context")
    check(rows["sdpa_cudnn"][3].endswith("%)"), "no share of the matmul ceiling")

    # Same input, same bytes: the README must not churn in version control.
    _, again = run_plot(workdir, TESTDATA)
    check(again == text, "a second run changed the README")


def test_partial_results(workdir):
    """No peers.json and no sweep: 2x2 layout, peers' cells and ceilings all dashes."""
    results_dir = os.path.join(workdir, "results")
    os.makedirs(results_dir)
    with open(os.path.join(TESTDATA, "bench.json"), encoding="utf-8") as f:
        bench = json.load(f)
    bench["benchmarks"] = [b for b in bench["benchmarks"] if "/sweep_bh" not in b["name"]]
    with open(os.path.join(results_dir, "bench.json"), "w", encoding="utf-8") as f:
        json.dump(bench, f)
    with open(os.path.join(workdir, "README.md"), "w", encoding="utf-8") as f:
        f.write(README)

    png, text = run_plot(workdir, results_dir)
    check_png(png)
    rows = table_rows(text)
    check(rows["sdpa_flash"][2:] == [plot.MISSING] * 5,
          f"peer row not all dashes: {rows['sdpa_flash']}")
    check(rows["01_naive"][2] == "9.60", f"seed without FA2 should be bare: {rows['01_naive'][2]}")
    check(f"copy {plot.MISSING} TB/s" in text, "missing ceiling not shown as a dash")


def test_missing_markers(workdir):
    readme = os.path.join(workdir, "README.md")
    with open(readme, "w", encoding="utf-8") as f:
        f.write("# No markers here\n")
    try:
        plot.main(["--results", TESTDATA, "--png", os.path.join(workdir, "p.png"),
                   "--readme", readme])
    except SystemExit as exc:
        check(exc.code not in (0, None), "missing markers exited with status 0")
        check("BEGIN RESULTS TABLE" in str(exc.code), f"unclear message: {exc.code}")
    else:
        raise AssertionError("a README without markers was accepted")


def test_missing_requirements(workdir):
    """Without its Python package, a tool says which and how to install it; no traceback."""
    shapes = os.path.join(workdir, "shapes.json")
    with open(shapes, "w", encoding="utf-8") as f:
        f.write('{"shapes": []}')
    cases = [("plot.py", "matplotlib", [], "tools/requirements.txt"),
             ("peers.py", "torch", ["--shapes", shapes, "--out", os.path.join(workdir, "p.json")],
              "tools/requirements-peers.txt")]
    for script, module, args, hint in cases:
        path = os.path.join(HERE, script)
        code = (f"import runpy, sys; sys.modules[{module!r}] = None; sys.argv = [{path!r}] + {args!r}; "
                f"runpy.run_path({path!r}, run_name='__main__')")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=60)
        check(result.returncode != 0, f"{script} without {module} exited with status 0")
        check(hint in result.stderr and "Traceback" not in result.stderr,
              f"{script} without {module}: unclear message: {result.stderr}")


def test_notebook_tables(workdir):
    """--notebooks rewrites the table between a notebook's STAGE TABLE markers, for its stage only:
    the stage, the one before, FA2 and cuDNN with same-run ratios, dashes where nothing ran."""
    stages = fixture_stages()
    stage, previous = stages[1], stages[0]
    notebooks = os.path.join(workdir, "notebooks_md")
    os.makedirs(notebooks)
    before, after = "# A stage\n\nText.\n\n", "\n\n## Next\n"
    page = os.path.join(notebooks, stage + ".md")
    decode = ("\n\n## Decode\n\n" + plot.DECODE_BEGIN_MARKER + "\nprevious decode table\n"
              + plot.DECODE_END_MARKER)
    with open(page, "w", encoding="utf-8") as f:
        f.write(before + plot.STAGE_BEGIN_MARKER + "\nstale\n" + plot.STAGE_END_MARKER + decode
                + after)
    unmarked = os.path.join(notebooks, previous + ".md")
    with open(unmarked, "w", encoding="utf-8") as f:
        f.write("# No table here\n")
    plot.main(["--results", TESTDATA, "--notebooks", notebooks])
    with open(page, encoding="utf-8") as f:
        text = f.read()
    check(text.startswith(before + plot.STAGE_BEGIN_MARKER), "text before the table changed")
    check(text.endswith(plot.DECODE_END_MARKER + after), "text after the tables changed")
    check("stale" not in text and "previous decode table" not in text,
          "an old table was not replaced")
    # The decode table: a row per decode shape; against a copy of the same bytes only where
    # peers.json has one (the fixture: decode_b1_sk32768 alone), a dash elsewhere.
    decode_rows = [line for line in text.split(plot.DECODE_BEGIN_MARKER)[1].splitlines()
                   if line.startswith("| `decode_")]
    check(len(decode_rows) == 6, f"the decode table has {len(decode_rows)} rows, not 6")
    with_copy = [row for row in decode_rows if row.endswith("× |")]
    check(len(with_copy) == 1 and with_copy[0].startswith("| `decode_b1_sk32768`"),
          f"the copy of the same bytes is compared on the wrong rows: {with_copy}")
    header = next(line for line in text.splitlines() if line.startswith("| shape"))
    for column in (f"`{previous}`", f"`{stage}`", "FA2", "cuDNN", f"{stage[:2]} vs {previous[:2]}"):
        check(column in header, f"column {column} missing from {header}")
    seed = next(line for line in text.splitlines() if line.startswith("| `seed`"))
    check(seed.count("×") == 3, f"the seed row does not have three ratios: {seed}")
    with open(unmarked, encoding="utf-8") as f:
        check(f.read() == "# No table here\n", "a notebook without markers was changed")
    plot.main(["--results", TESTDATA, "--notebooks", notebooks])
    with open(page, encoding="utf-8") as f:
        check(f.read() == text, "a second run changed the notebook")


def test_canonical_name():
    check(plot.canonical_name("04_wmma/seed/manual_time") == "04_wmma/seed", "manual_time kept")
    check(plot.canonical_name("04_wmma/seed/iterations:10/repeats:3") == "04_wmma/seed",
          "Google Benchmark options kept in the name")


def main():
    tests = [test_full_results, test_partial_results, test_missing_markers, test_missing_requirements,
             test_notebook_tables]
    test_canonical_name()
    for test in tests:
        workdir = tempfile.mkdtemp(prefix="test_plot_")
        try:
            test(workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"test_plot: {len(tests) + 1} checks passed")


if __name__ == "__main__":
    main()
