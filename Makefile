# The two commands of the README. Each sets itself up (scripts/bootstrap.sh) and is safe to run twice.
.PHONY: demo test lint gpu-test

demo:
	@bash scripts/bootstrap.sh
	.venv/bin/fusebot demo

# The tests run in two processes: most of the suite's time is process start-ups, builds and compiles that keep one
# core busy. A file's tests stay in one process (--dist loadfile), so its module fixtures are built once.
test:
	@bash scripts/bootstrap.sh
	.venv/bin/ruff check .
	.venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=20

gpu-test:
	@bash scripts/bootstrap.sh
	.venv/bin/python -m pytest -q -m gpu
