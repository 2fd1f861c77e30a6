"""`make screenshots`: a fresh shot of every console page at 1280x800 and 1440x900 in docs/screenshots/.

The layout test (tests/e2e/test_layouts_fit.py) already starts the console on a seeded test database and
opens every route of frontend/src/routes.tsx at both sizes; with LAYOUT_SCREENSHOTS set it also saves each
page as `<page>-<width>x<height>.png` (the window, not the whole scrolled page: what an operator sees
first). This script runs it into a scratch folder, reduces each PNG to a 256-colour palette (about a third
of the size; the console's flat colours survive it) and replaces the previous set in docs/screenshots/.
Other screenshots there (named by the docs that show them) are left alone.

Usage (needs PostgreSQL and Redis, as the tests do): DATABASE_URL=postgres://... python scripts/screenshots.py
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

REPO_ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/e2e/test_layouts_fit.py"
# The files this script owns: <page>-1280x800.png and <page>-1440x900.png.
SHOT_NAME = re.compile(r"^[a-z0-9-]+-(1280x800|1440x900)\.png$")


def shrink(path: Path) -> None:
    """Rewrite a screenshot as an optimized 256-colour PNG."""
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        print(
            "screenshots: set DATABASE_URL to a PostgreSQL server (the e2e tests need one)", file=sys.stderr
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="screenshots-") as scratch:
        env = {**os.environ, "LAYOUT_SCREENSHOTS": scratch}
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "0", TEST]
        result = subprocess.run(command, cwd=REPO_ROOT, env=env, check=False)
        shots = sorted(Path(scratch).glob("*.png"))
        if not shots:
            print("screenshots: the layout test saved no screenshot", file=sys.stderr)
            return result.returncode or 1
        args.out.mkdir(parents=True, exist_ok=True)
        for old in args.out.iterdir():
            if SHOT_NAME.match(old.name):
                old.unlink()
        total = 0
        for shot in shots:
            shrink(shot)
            shutil.copyfile(shot, args.out / shot.name)
            total += shot.stat().st_size
    print(f"screenshots: {len(shots)} shots, {total / 1e6:.1f} MB, in {args.out}")
    if result.returncode:
        print(
            "screenshots: the layout test failed (see above); the shots show the pages as they are",
            file=sys.stderr,
        )
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
