"""Authoring, for maintainers: exercises/ and the grader's manifest are generated from solutions/
(make_exercises.py → manifest.py), and nbgrader_config.py lays the course out for nbgrader.
"""
