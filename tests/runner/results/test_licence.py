"""The SPDX line on every file a PR adds (runner/results/licence.py): the licence the repository declares (its
licence file's SPDX line or text, pyproject.toml's `license`), else NOASSERTION; each file's own comment syntax."""

from __future__ import annotations

from runner.results.licence import NOASSERTION, licence_note, repo_licence, with_spdx

MIT = """MIT License

Copyright (c) 2024 Someone

Permission is hereby granted, free of charge, to any person obtaining a copy of this software ... The above copyright
notice and this permission notice shall be included in all copies or substantial portions of the Software.
"""
APACHE = "                                 Apache License\n                           Version 2.0, January 2004\n"
BSD3 = ("Redistribution and use in source and binary forms, with or without modification, are permitted ...\n"
        "3. Neither the name of the copyright holder nor the names of its contributors may be used ...\n")
GPL = "                    GNU GENERAL PUBLIC LICENSE\n                       Version 3, 29 June 2007\n"


def test_the_repositorys_declared_licence(tmp_path):
    assert repo_licence(tmp_path) == (NOASSERTION, "")
    for text, want in ((MIT, "MIT"), (APACHE, "Apache-2.0"), (BSD3, "BSD-3-Clause"), (GPL, NOASSERTION),
                       ("SPDX-License-Identifier: GPL-3.0-or-later\n" + GPL, "GPL-3.0-or-later")):
        (tmp_path / "LICENSE").write_text(text)
        assert repo_licence(tmp_path) == (want, "LICENSE" if want != NOASSERTION else ""), text[:40]
    (tmp_path / "LICENSE").unlink()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nlicense = {text = "BSD-2-Clause"}\n')
    assert repo_licence(tmp_path) == ("BSD-2-Clause", "pyproject.toml")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nlicense = {text = "see the file"}\n')
    assert repo_licence(tmp_path) == (NOASSERTION, "")


def test_every_added_file_carries_the_line_in_its_own_syntax():
    files = {"t/dropin.py": '"""doc"""\n', "t/kernel.cu": "// k\n", "t/fusebot.h": "/* h */\n", "t/BENCHMARK.md": "# b\n",
             "t/fusebot.json": "{}\n", "t/kernel.sm_90.cubin.b64": "# c\nAAAA\n", "t/kernel.compute_90.ptx": ".x\n",
             "/examples/m.py": "user's\n", "t/reference.py": "user's\n"}
    out = with_spdx(files, "Apache-2.0", skip=("t/reference.py",))
    assert out["t/dropin.py"] == '# SPDX-License-Identifier: Apache-2.0\n"""doc"""\n'
    assert out["t/kernel.cu"].startswith("// SPDX-License-Identifier: Apache-2.0\n// k")
    assert out["t/fusebot.h"].startswith("// SPDX-License-Identifier: MIT\n")  # fusebot's own file, unchanged
    assert out["t/BENCHMARK.md"].startswith("<!-- SPDX-License-Identifier: Apache-2.0 -->\n")
    assert out["t/kernel.sm_90.cubin.b64"].startswith("# SPDX") and out["t/kernel.compute_90.ptx"].startswith("// SPDX")
    assert out["t/fusebot.json"] == "{}\n" and out["/examples/m.py"] == "user's\n" and out["t/reference.py"] == "user's\n"
    assert with_spdx(out, "Apache-2.0", skip=("t/reference.py",)) == out  # once
    assert "declares no licence" in licence_note(NOASSERTION, "") and "as LICENSE declares" in licence_note("MIT", "LICENSE")
