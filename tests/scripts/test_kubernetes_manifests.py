#!/usr/bin/env python3
"""Checks examples/kubernetes offline (no cluster here can apply them).

  test_kubernetes_manifests.py BUILD_DIR MANIFEST_DIR

Every document parses and has its kind's required fields; every vflow program a container
runs is one this build has, and every flag given to it is one its --help lists; every
VFLOW_* variable is one vflow reads; each job spec in a ConfigMap passes
`vflow-train --check`; every Secret, ConfigMap and claim a container mounts is a volume of
its pod, and every mount names a volume.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

import yaml

REQUIRED = {
    "Service": ["spec.ports"],
    "StatefulSet": ["spec.serviceName", "spec.selector", "spec.template.spec.containers"],
    "DaemonSet": ["spec.selector", "spec.template.spec.containers"],
    "Job": ["spec.template.spec.containers", "spec.template.spec.restartPolicy"],
    "ConfigMap": ["data"],
}
PROGRAMS = ("vflow-agent", "vflow-train", "vflow-ctl")
# The variables vflow reads (docs/distributed.md); anything else named VFLOW_ is a typo.
KNOWN_VARIABLES = {"VFLOW_ETCD_CA", "VFLOW_ETCD_CERT", "VFLOW_ETCD_KEY", "VFLOW_ETCD_USER",
                   "VFLOW_ETCD_PASSWORD_FILE"}

failures = []


def fail(where, what):
    failures.append(f"{where}: {what}")


def field(doc, path):
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def flags_of(build, program):
    out = subprocess.run([os.path.join(build, program), "--help"], capture_output=True,
                         text=True).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out))


def check_pod(where, spec, build, help_flags, claims=()):
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    volumes.update({name: {} for name in claims})  # a StatefulSet's own claims
    for c in spec.get("containers", []):
        here = f"{where} container {c.get('name')}"
        for key in ("name", "image"):
            if key not in c:
                fail(here, f"no {key}")
        command = c.get("command", [])
        program = os.path.basename(command[0]) if command else ""
        if program.startswith("vflow"):
            if program not in PROGRAMS:
                fail(here, f"runs {program}, which vflow does not build")
            else:
                for arg in command[1:]:
                    flag = str(arg).split("=")[0]
                    if flag.startswith("--") and flag not in help_flags[program]:
                        fail(here, f"{program} takes no {flag}")
        for env in c.get("env", []):
            name = env.get("name", "")
            if name.startswith("VFLOW_") and name not in KNOWN_VARIABLES:
                fail(here, f"vflow reads no variable {name}")
        for mount in c.get("volumeMounts", []):
            if mount.get("name") not in volumes:
                fail(here, f"mounts {mount.get('name')}, which the pod does not declare")
    return volumes


def main():
    build, folder = sys.argv[1], sys.argv[2]
    help_flags = {p: flags_of(build, p) for p in PROGRAMS}
    for p, flags in help_flags.items():
        if "--control" not in flags:
            fail(p, "its --help lists no --control: is the build complete?")
    files = sorted(glob.glob(os.path.join(folder, "*.yaml")))
    if not files:
        fail(folder, "no manifests")
    seen = 0
    for path in files:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        for doc in docs:
            seen += 1
            kind = doc.get("kind")
            where = f"{os.path.basename(path)} {kind} {field(doc, 'metadata.name')}"
            for key in ("apiVersion", "kind", "metadata.name"):
                if field(doc, key) is None:
                    fail(where, f"no {key}")
            if kind not in REQUIRED:
                fail(where, f"an unexpected kind {kind}")
                continue
            for key in REQUIRED[kind]:
                if field(doc, key) is None:
                    fail(where, f"no {key}")
            pod = field(doc, "spec.template.spec")
            if pod:
                claims = [field(t, "metadata.name")
                          for t in field(doc, "spec.volumeClaimTemplates") or []]
                check_pod(where, pod, build, help_flags, claims)
            if kind == "ConfigMap":
                for name, text in doc["data"].items():
                    if not name.endswith(".yaml"):
                        continue
                    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as spec:
                        spec.write(text)
                        spec.flush()
                        r = subprocess.run([os.path.join(build, "vflow-train"), spec.name,
                                            "--check"], capture_output=True, text=True)
                        if r.returncode != 0:
                            fail(where, f"{name} is not a valid job spec: {r.stderr.strip()}")
    for f in failures:
        print("FAIL", f)
    print(f"{len(files)} files, {seen} documents, {len(failures)} problems")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
