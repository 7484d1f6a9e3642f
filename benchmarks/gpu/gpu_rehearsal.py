"""What the GPU machine's image (benchmarks/gpu/gpu_image.txt) and the carried wheels (.whl/, made by
benchmarks/gpu/gpu_wheels.sh) hold, checked before a try is spent on them:

    python3 -m benchmarks.gpu.gpu_rehearsal --check-wheels .whl [--image-pin NAME==VERSION ...]
        every requirement of every carried wheel (its METADATA's Requires-Dist, for CPython 3.12 on Linux
        x86-64, no extras) met by a carried wheel (they come first on PYTHONPATH) or by the image's
        version; lists the image's packages the carried ones need a least version of. Exit 1 on a problem.
    python3 -m benchmarks.gpu.gpu_rehearsal --check-venv
        (run with the rehearsal's Python) every installed distribution is one the image holds.

benchmarks/gpu/gpu_rehearsal.sh runs both, then the check itself in that Python: the requirements a wheel
does not declare (e.g. `import trainer` without the checkout on PYTHONPATH) only that run shows.
"""
from __future__ import annotations

import argparse
import re
import sys
import zipfile
from pathlib import Path

IMAGE = Path(__file__).resolve().parent / "gpu_image.txt"
# the device's interpreter, for requirement markers
MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_image(path: Path = IMAGE) -> tuple[dict, set]:
    """({name: version} installed in the rehearsal, {every package name on the image})."""
    pins, names, listing = {}, set(), False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if line.startswith("# names:"):
            listing = True
        elif listing and line.startswith("#   "):
            names |= {canonical(x) for x in line[4:].replace(",", " ").split()}
        elif text:
            name, sep, version = text.partition("==")
            if not sep or not version.strip():
                raise SystemExit(f"{path}:{n}: expected NAME==VERSION, got {text!r}")
            pins[canonical(name)] = version.strip()
    missing = sorted(set(pins) - names)
    if missing:
        raise SystemExit(f"{path}: pinned but not among the image's names: {', '.join(missing)}")
    return pins, names


def apply_pins(pins: dict, overrides: list[str]) -> dict:
    """The image with NAME==VERSION overrides (a rehearsal against another version of one of them)."""
    out = dict(pins)
    for item in overrides:
        name, sep, version = item.partition("==")
        if not sep or not version:
            raise SystemExit(f"--image-pin {item}: expected NAME==VERSION")
        out[canonical(name)] = version
    return out


def wheel_metadata(whl: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist lines) of a wheel."""
    with zipfile.ZipFile(whl) as z:
        meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        if meta is None:
            raise SystemExit(f"{whl}: no .dist-info/METADATA: not a wheel")
        text = z.read(meta).decode("utf-8", "replace").split("\n\n", 1)[0]
    fields = [line.split(": ", 1) for line in text.splitlines() if ": " in line]
    get = lambda key: [v for k, v in fields if k == key]  # noqa: E731
    return canonical(get("Name")[0]), get("Version")[0], get("Requires-Dist")


def check_wheels(whl_dir: Path, pins: dict, names: set) -> tuple[list[str], list[str]]:
    """(problems that would stop the device, the image's versions the carried wheels need a least of)."""
    from packaging.requirements import Requirement

    wheels = sorted(whl_dir.glob("*.whl"))
    if not wheels:
        return [f"{whl_dir}: no wheels (bash benchmarks/gpu/gpu_wheels.sh makes them)"], []
    carried, problems, bounds = {}, [], []
    for whl in wheels:
        name, version, _ = wheel_metadata(whl)
        if name in carried:
            problems.append(f"{name}: two wheels ({carried[name]} and {version}); pip --target takes one of each")
        carried[name] = version
    for whl in wheels:
        name, version, requires = wheel_metadata(whl)
        for line in requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(MARKERS):
                continue
            dep = canonical(req.name)
            have, where = (carried[dep], "carried") if dep in carried else (pins.get(dep), "image")
            who = f"{name} {version} needs {req.name}{req.specifier or ''}"
            if have is None:
                problems.append(f"{who}: " + ("on the image, but gpu_image.txt gives no version: add it there"
                                              if dep in names else "neither carried nor on the image: carry it"))
            elif req.specifier and not req.specifier.contains(have, prereleases=True):
                problems.append(f"{who}: the {where}'s is {have}")
            elif where == "image" and any(s.operator in (">=", ">", "==", "~=") for s in req.specifier):
                bounds.append(f"{who}: the image's {have}")
    return problems, sorted(set(bounds))


def check_venv(names: set) -> list[str]:
    """Installed distributions of this Python that the image does not hold (pip aside). Only the environment's
    own site-packages count: the working directory on sys.path may hold the project's editable-install
    metadata (hybrid_nmt.egg-info, left by `pip install -e .` of another Python), which the device never sees."""
    import sysconfig
    from importlib.metadata import distributions

    paths = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    installed = {canonical(d.metadata["Name"]) for d in distributions(path=paths)}
    return sorted(installed - names - {"pip"})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check-wheels", type=Path, metavar="DIR")
    p.add_argument("--check-venv", action="store_true")
    p.add_argument("--image", type=Path, default=IMAGE)
    p.add_argument("--image-pin", action="append", default=[], metavar="NAME==VERSION")
    args = p.parse_args(argv)
    pins, names = read_image(args.image)
    pins = apply_pins(pins, args.image_pin)
    failed = False
    if args.check_wheels:
        problems, bounds = check_wheels(args.check_wheels, pins, names)
        for b in bounds:
            print(f"gpu_rehearsal: relies on {b}")
        for problem in problems:
            print(f"gpu_rehearsal: PROBLEM: {problem}")
        print(f"gpu_rehearsal: {len(list(args.check_wheels.glob('*.whl')))} carried wheels against {args.image.name}"
              + (f" with {', '.join(args.image_pin)}" if args.image_pin else "") + f": {len(problems)} problems")
        failed |= bool(problems)
    if args.check_venv:
        extra = check_venv(names)
        if extra:
            print(f"gpu_rehearsal: PROBLEM: installed here but not on the image: {', '.join(extra)}")
        failed |= bool(extra)
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
