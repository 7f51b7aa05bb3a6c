#!/usr/bin/env python3
"""A CycloneDX 1.5 SBOM (JSON) of the Rust crates the release binaries link, from `cargo metadata`
(the normal dependencies of the `gateway` and `operator` packages, resolved for this platform),
written with the CycloneDX project's own library (PyPI's cyclonedx-python-lib).

    python3 scripts/sbom.py VERSION > sbom.cdx.json

Each crate is a `library` component with its purl (`pkg:cargo/NAME@VERSION`), its license
expression and, for crates.io crates, the SHA-256 Cargo.lock pins; the two binaries are the
`application` the BOM describes, and every dependency edge is recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cyclonedx.model import HashAlgorithm, HashType
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.license import LicenseExpression
from cyclonedx.output.json import JsonV1Dot5
from packageurl import PackageURL

ROOT = Path(__file__).resolve().parents[1]
BINARIES = ("gateway", "operator")


def metadata() -> dict:
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", host()],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def host() -> str:
    out = subprocess.run(["rustc", "-vV"], check=True, capture_output=True, text=True).stdout
    return next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("host: "))


def linked_crates() -> set[tuple[str, str]]:
    """(name, vVERSION) of every crate in the normal dependency tree of the binaries."""
    args = ["cargo", "tree", "--locked", "-e", "normal", "--prefix", "none", "--format", "{p}"]
    for binary in BINARIES:
        args += ["-p", binary]
    out = subprocess.run(args, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return {tuple(line.split()[:2]) for line in out.splitlines() if line.strip()}


def checksums() -> dict[tuple[str, str], str]:
    """(name, version) -> the SHA-256 Cargo.lock records for a registry crate."""
    sums: dict[tuple[str, str], str] = {}
    package: dict[str, str] = {}
    for line in (ROOT / "Cargo.lock").read_text().splitlines() + ["[[package]]"]:
        if line == "[[package]]":
            if "checksum" in package:
                sums[(package["name"], package["version"])] = package["checksum"]
            package = {}
        elif " = " in line:
            key, value = line.split(" = ", 1)
            package[key] = value.strip('"')
    return sums


def main(version: str) -> None:
    meta = metadata()
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    roots = [pid for pid, p in packages.items() if p["name"] in BINARIES and p["source"] is None]
    # The crates the binaries link, as Cargo resolves them for these two packages alone:
    # `cargo metadata` unifies features over the whole workspace, tests included, so a
    # dependency only a test enables would be listed.
    tree = {(name, version.lstrip("v")) for name, version in linked_crates()}
    linked = {pid for pid, p in packages.items() if (p["name"], p["version"]) in tree}
    sums = checksums()
    bom = Bom()
    bom.metadata.component = Component(
        name="svc-gateway",
        version=version,
        type=ComponentType.APPLICATION,
        bom_ref="svc-gateway",
        licenses=[LicenseExpression("Apache-2.0")],
    )
    components: dict[str, Component] = {}
    for pid in sorted(linked, key=lambda i: (packages[i]["name"], packages[i]["version"])):
        p = packages[pid]
        component = Component(
            name=p["name"],
            version=p["version"],
            type=ComponentType.APPLICATION if pid in roots else ComponentType.LIBRARY,
            bom_ref=f"{p['name']}@{p['version']}",
            purl=PackageURL(type="cargo", name=p["name"], version=p["version"]),
            licenses=[LicenseExpression(p["license"])] if p.get("license") else [],
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=sums[(p["name"], p["version"])])]
            if (p["name"], p["version"]) in sums
            else [],
        )
        components[pid] = component
        bom.components.add(component)
    for pid in linked:
        deps = [
            components[d["pkg"]]
            for d in nodes[pid]["deps"]
            if d["pkg"] in components and any(k["kind"] is None for k in d["dep_kinds"])
        ]
        if deps:
            bom.register_dependency(components[pid], deps)
    bom.register_dependency(bom.metadata.component, [components[r] for r in roots])
    print(JsonV1Dot5(bom).output_as_string(indent=2))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: sbom.py VERSION")
    main(sys.argv[1])
