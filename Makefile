# The two commands of the README. Each sets itself up (scripts/bootstrap.sh) and is safe to run twice.
.PHONY: demo test lint gpu-test

demo:
	@bash scripts/bootstrap.sh
	.venv/bin/fusebot demo

test:
	@bash scripts/bootstrap.sh
	.venv/bin/ruff check .
	.venv/bin/python -m pytest -q

gpu-test:
	@bash scripts/bootstrap.sh
	.venv/bin/python -m pytest -q -m gpu
