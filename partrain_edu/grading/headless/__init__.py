"""Headless grading of untrusted notebooks, for instructors: `partrain-edu check PATH [--csv grades.csv]` (cli.py).

Apart from the learner's `check()` path on purpose: nothing here runs when a notebook calls `check`.
- grader.py: grade one notebook against the instructor's checks; every verdict computed here;
- submissions.py: which notebooks, which exercise each is, their code cells (one bad file is one failed row);
- sandbox.py, jail.py, view.py: where a submission's code runs (a user, namespaces, a view of the package
  without the course's answers) and how it is stopped with everything it started;
- kernel.py, rank_runner.py: the sandboxed processes — the submission's cells, a multi-rank check's ranks;
- channel.py: the JSON lines between the grader and them, read as the learner's data.
"""
