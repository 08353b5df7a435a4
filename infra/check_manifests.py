"""Static checks of the cluster files in infra/ — no Kubernetes, no GPU, nothing started.

    .venv/bin/python infra/check_manifests.py                  # structure + rlcr's own config and fit checks
    .venv/bin/python infra/check_manifests.py --crd-dir DIR    # + KubeRay's CRD schemas (ray.io_rayjobs.yaml,
                                                               #   ray.io_rayclusters.yaml from a KubeRay release)

What it checks (each line it prints is one check; exit status 1 if any fails):

* every YAML file parses; RayJob/RayCluster use only fields of KubeRay's ray.io/v1 types (v1.7.0's
  rayjob_types.go / raycluster_types.go) and pass the rules of its ValidateRayJobSpec/ValidateRayClusterSpec
  that apply here (TTL needs shutdownAfterJobFinishes, positive deadline, min ≤ replicas ≤ max, …);
* the RayJob entrypoint is `python -m flows.train --config <file in this repo> --run-id <valid id>
  field=value…` with no shell operators (KubeRay pastes it into a bash line), storage on s3://, and — when
  the rlcr package is importable — the config plus overrides load (rlcr.config), and the run's engines and
  trainer workers fit in the pods' GPUs and CPUs by rlcr.runs.cluster.check_fits, the check the flow itself runs;
* the runtime env names no variable that rlcr.runs.cluster.ensure_ray also sets (Ray refuses to merge them);
* one image everywhere, matching Ray versions (constraints.txt, the Dockerfile's base tag, rayVersion);
  S3 credentials from the rlcr-s3 Secret in every pod; /dev/shm memory-backed and larger than the object
  store; GPU requests equal to limits; no autoscaling below the fixed size the flow's fit check needs;
* prefect.yaml's entrypoints exist and its parameters are arguments of those flows.

With --crd-dir, RayJob and RayCluster are also checked against the CRDs' openAPIV3Schema: types, enums,
required fields and unknown fields (what `kubectl apply` with server-side strict validation rejects).
"""

from __future__ import annotations

import argparse
import ast
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

INFRA = Path(__file__).resolve().parent
REPO = INFRA.parent
IMAGE_ROOT = "/opt/rlcr"  # WORKDIR of infra/Dockerfile
SECRET = "rlcr-s3"

# KubeRay v1.7.0, ray-operator/apis/ray/v1/rayjob_types.go (RayJobSpec json tags).
RAYJOB_SPEC_FIELDS = {
    "activeDeadlineSeconds", "backoffLimit", "rayClusterSpec", "submitterPodTemplate", "metadata",
    "clusterSelector", "submitterConfig", "managedBy", "deletionStrategy", "entrypoint", "runtimeEnvYAML",
    "jobId", "submissionMode", "entrypointResources", "entrypointNumCpus", "entrypointNumGpus",
    "ttlSecondsAfterFinished", "preRunningDeadlineSeconds", "shutdownAfterJobFinishes", "suspend", "schedule",
}
SUBMISSION_MODES = {"K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"}
# KubeRay v1.7.0, raycluster_types.go (RayClusterSpec, HeadGroupSpec, WorkerGroupSpec json tags).
RAYCLUSTER_SPEC_FIELDS = {
    "upgradeStrategy", "authOptions", "suspend", "managedBy", "autoscalerOptions", "headServiceAnnotations",
    "enableInTreeAutoscaling", "gcsFaultToleranceOptions", "headGroupSpec", "rayVersion", "workerGroupSpecs",
    "historyServerOptions", "networkPolicy", "tlsOptions",
}
HEAD_GROUP_FIELDS = {"template", "headService", "enableIngress", "resources", "labels", "rayStartParams",
                     "serviceType"}
WORKER_GROUP_FIELDS = {"suspend", "groupName", "replicas", "minReplicas", "maxReplicas", "idleTimeoutSeconds",
                       "resources", "labels", "rayStartParams", "template", "scaleStrategy", "numOfHosts"}
# Ray's RuntimeEnv.known_fields (ray 2.60) that make sense in a RayJob.
RUNTIME_ENV_FIELDS = {"py_modules", "py_executable", "java_jars", "working_dir", "conda", "pip", "uv",
                      "container", "excludes", "env_vars", "_ray_release", "_ray_commit", "_inject_current_ray",
                      "config", "worker_process_setup_hook", "_nsight", "_rocprof_sys", "image_uri", "nsight",
                      "rocprof_sys"}
SHELL_OPERATORS = re.compile(r"[;&|<>`]|\$\(")
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class Report:
    def __init__(self) -> None:
        self.failed: list[str] = []
        self.passed = 0

    def check(self, ok: bool, what: str, detail: str = "") -> bool:
        if ok:
            self.passed += 1
            print(f"ok    {what}")
        else:
            self.failed.append(what)
            print(f"FAIL  {what}" + (f": {detail}" if detail else ""))
        return ok


# ----------------------------------------------------------------------------- helpers

def quantity(q: Any) -> float:
    """A Kubernetes quantity (`16`, `500m`, `128Gi`, `30e9`) as a number (bytes or cores)."""
    s = str(q).strip()
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
             "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "m": 1e-3}
    for u in sorted(units, key=len, reverse=True):
        if s.endswith(u):
            return float(s[: -len(u)]) * units[u]
    return float(s)


def ray_version_pinned() -> str:
    for line in (REPO / "constraints.txt").read_text().splitlines():
        m = re.match(r"^ray==([\w.]+)", line.strip())
        if m:
            return m.group(1)
    raise SystemExit("constraints.txt pins no ray version")


def dockerfile_base() -> str:
    for line in (INFRA / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            return line.split()[1]
    raise SystemExit("infra/Dockerfile has no FROM")


def ensure_ray_env_vars() -> set[str]:
    """The env_vars that rlcr.runs.cluster.ensure_ray passes in ray.init(runtime_env=...), read from its source."""
    tree = ast.parse((REPO / "rlcr" / "runs" / "cluster.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "runtime_env" and isinstance(node.value, ast.Dict):
            for k, v in zip(node.value.keys, node.value.values):
                if isinstance(k, ast.Constant) and k.value == "env_vars" and isinstance(v, ast.Dict):
                    names |= {e.value for e in v.keys if isinstance(e, ast.Constant)}
    return names


def flow_parameters(entrypoint: str) -> set[str] | None:
    """Argument names of the function `path.py:name`, read from its source (None if it does not exist)."""
    path, _, name = entrypoint.partition(":")
    file = REPO / path
    if not file.exists():
        return None
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return {a.arg for a in node.args.args + node.args.kwonlyargs}
    return None


def rlcr_modules():
    """(rlcr.config, rlcr.runs.cluster, rlcr.storage) when the project is importable (its venv), else None."""
    sys.path.insert(0, str(REPO))
    try:
        import rlcr.config
        import rlcr.runs.cluster
        import rlcr.storage
    except Exception:  # noqa: BLE001 — pure-YAML checks still run
        return None
    return rlcr.config, rlcr.runs.cluster, rlcr.storage


def containers_of(pod_template: dict) -> list[dict]:
    return ((pod_template or {}).get("spec") or {}).get("containers") or []


def env_map(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env") or []}


# ----------------------------------------------------------------------------- checks

def check_pod(r: Report, where: str, pod_template: dict, *, ray_start: dict | None, image: str) -> None:
    spec = pod_template.get("spec") or {}
    cs = containers_of(pod_template)
    if not r.check(bool(cs), f"{where}: has a container"):
        return
    c = cs[0]  # KubeRay's Ray container is the first one
    r.check(c.get("image") == image, f"{where}: image is {image}", f"got {c.get('image')}")
    res = c.get("resources") or {}
    req, lim = res.get("requests") or {}, res.get("limits") or {}
    gpus = lim.get("nvidia.com/gpu")
    if gpus is not None:
        r.check(req.get("nvidia.com/gpu") == gpus, f"{where}: GPU requests equal limits")
        r.check(any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations") or []),
                f"{where}: tolerates the nvidia.com/gpu taint")
    r.check("memory" in lim and "cpu" in lim, f"{where}: cpu and memory limits set (ray start reads them)")
    env = env_map(c)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        ref = ((env.get(key) or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
        r.check(ref.get("name") == SECRET and ref.get("key") == key and not ref.get("optional"),
                f"{where}: {key} from Secret {SECRET}")
    ref = ((env.get("AWS_ENDPOINT_URL_S3") or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
    r.check(ref.get("name") == SECRET and ref.get("optional") is True,
            f"{where}: optional S3 endpoint (AWS_ENDPOINT_URL_S3) from Secret {SECRET}")
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    for var in ("RLCR_CACHE", "TMPDIR"):
        value = (env.get(var) or {}).get("value", "")
        r.check(any(value == p or value.startswith(p.rstrip("/") + "/") for p in mounts if p != "/dev/shm"),
                f"{where}: {var} ({value or 'unset'}) is on a mounted volume")
    shm = volumes.get(mounts.get("/dev/shm", ""), {}).get("emptyDir")
    if r.check(bool(shm) and shm.get("medium") == "Memory" and "sizeLimit" in shm,
               f"{where}: /dev/shm is a memory-backed emptyDir with a size"):
        if ray_start is not None and "object-store-memory" in ray_start:
            store, shm_bytes = float(ray_start["object-store-memory"]), quantity(shm["sizeLimit"])
            r.check(store < 0.95 * shm_bytes, f"{where}: object store < 95% of /dev/shm",
                    f"{store:.3g} B vs {shm_bytes:.3g} B")
            r.check(store < quantity(lim.get("memory", 0)),
                    f"{where}: object store fits in the memory limit")


def check_cluster_spec(r: Report, where: str, spec: dict, annotations: dict, image: str,
                       ray_version: str) -> dict[str, float]:
    """Checks a RayClusterSpec; returns the Ray resources its workers offer (for the fit check)."""
    r.check(set(spec) <= RAYCLUSTER_SPEC_FIELDS, f"{where}: only RayClusterSpec fields",
            str(sorted(set(spec) - RAYCLUSTER_SPEC_FIELDS)))
    r.check(str(spec.get("rayVersion")) == ray_version, f"{where}: rayVersion {ray_version}",
            f"got {spec.get('rayVersion')}")
    autoscaling = bool(spec.get("enableInTreeAutoscaling"))
    head = spec.get("headGroupSpec") or {}
    r.check(set(head) <= HEAD_GROUP_FIELDS, f"{where}: only HeadGroupSpec fields", str(set(head) - HEAD_GROUP_FIELDS))
    hstart = head.get("rayStartParams") or {}
    r.check(str(hstart.get("num-cpus")) == "0", f"{where}: head has num-cpus 0 (no actors on the head)")
    r.check("labels" not in hstart, f"{where}: head rayStartParams without `labels`")
    check_pod(r, f"{where} head", head.get("template") or {}, ray_start=hstart, image=image)
    head_c = (containers_of(head.get("template") or {}) or [{}])[0]
    if str(annotations.get("ray.io/overwrite-container-cmd", "")).lower() == "true":
        args = " ".join(head_c.get("args") or [])
        r.check("$KUBERAY_GEN_RAY_START_CMD" in args or "${KUBERAY_GEN_RAY_START_CMD" in args,
                f"{where}: overwritten head command still starts Ray ($KUBERAY_GEN_RAY_START_CMD)")
        r.check("ulimit -n" in args, f"{where}: overwritten head command raises the file limit")
    offered = {"CPU": 0.0, "GPU": 0.0}
    for g in spec.get("workerGroupSpecs") or []:
        name = f"{where} worker group {g.get('groupName')}"
        r.check(set(g) <= WORKER_GROUP_FIELDS, f"{name}: only WorkerGroupSpec fields",
                str(set(g) - WORKER_GROUP_FIELDS))
        lo, n, hi = g.get("minReplicas"), g.get("replicas"), g.get("maxReplicas")
        if not autoscaling:
            r.check(lo is not None and hi is not None, f"{name}: minReplicas and maxReplicas set (no autoscaling)")
        r.check(lo is None or hi is None or (lo <= (n if n is not None else lo) <= hi),
                f"{name}: minReplicas ≤ replicas ≤ maxReplicas")
        r.check(not autoscaling or (lo or 0) >= (n or 0),
                f"{name}: never below its size (the flow's fit check sees only running pods)")
        wstart = g.get("rayStartParams") or {}
        r.check("labels" not in wstart, f"{name}: rayStartParams without `labels`")
        check_pod(r, name, g.get("template") or {}, ray_start=wstart, image=image)
        lim = ((containers_of(g.get("template") or {}) or [{}])[0].get("resources") or {}).get("limits") or {}
        pods = float(n if n is not None else (lo or 0)) * float(g.get("numOfHosts") or 1)
        offered["CPU"] += pods * float(wstart.get("num-cpus", quantity(lim.get("cpu", 0))))
        offered["GPU"] += pods * float(wstart.get("num-gpus", quantity(lim.get("nvidia.com/gpu", 0))))
    return offered


def check_entrypoint(r: Report, entrypoint: str, mods, where: str = "rayjob.yaml") -> tuple[Any, dict] | None:
    r.check(not SHELL_OPERATORS.search(entrypoint), f"{where} entrypoint: no shell operators",
            "KubeRay pastes it into `bash -c '... ray job submit -- <entrypoint> ; ...'`")
    words = shlex.split(entrypoint)
    if not r.check(words[:3] == ["python", "-m", "flows.train"], f"{where} entrypoint runs `python -m flows.train`"):
        return None
    ap = argparse.ArgumentParser(add_help=False)  # flows.train.main()'s arguments
    ap.add_argument("--config")
    ap.add_argument("--run-id")
    ap.add_argument("--iterations", type=int)
    ap.add_argument("overrides", nargs="*")
    try:
        a = ap.parse_args(words[3:])
    except SystemExit:
        r.check(False, f"{where} entrypoint: flows.train accepts its arguments", " ".join(words[3:]))
        return None
    config = Path(a.config.replace(IMAGE_ROOT, str(REPO), 1)) if a.config else None
    r.check(bool(a.config) and a.config.startswith(IMAGE_ROOT + "/") and config.exists(),
            f"{where} entrypoint: --config is an absolute path in the image that exists in the repo ({a.config})")
    r.check(bool(a.run_id), f"{where} entrypoint: --run-id given (the same id resumes the run)")
    pairs = dict(o.split("=", 1) for o in a.overrides if "=" in o)
    r.check(len(pairs) == len(a.overrides), f"{where} entrypoint: overrides are field=value")
    r.check(pairs.get("storage.uri", "").startswith("s3://"), f"{where} entrypoint: storage.uri on s3://")
    model = pairs.get("model.name")
    r.check(model is None or "://" in model or model.startswith("/models/"),
            f"{where} entrypoint: model is a URI (or a path baked into the image)")
    if mods is None:
        print("skip  RayJob entrypoint: config + overrides load (rlcr not importable: run with .venv/bin/python)")
        return None
    config_mod, _, storage = mods
    try:
        storage.validate_run_id(a.run_id)
        r.check(True, f"{where} entrypoint: run id {a.run_id!r} is valid")
    except ValueError as e:
        r.check(False, f"{where} entrypoint: run id is valid", str(e))
    try:
        cfg = config_mod.RLCRConfig.from_yaml(config, a.overrides)
    except config_mod.ConfigError as e:
        r.check(False, f"{where} entrypoint: config + overrides load", str(e))
        return None
    r.check(True, f"{where} entrypoint: config + overrides load (rlcr.config)")
    r.check(cfg.update.use_gpu, f"{where} entrypoint: the config trains on GPUs (update.use_gpu)")
    return cfg, pairs


def check_fit(r: Report, where: str, cfg, offered: dict[str, float], mods) -> None:
    _, cluster, _ = mods
    try:
        cluster.check_fits(cfg, offered)
        r.check(True, f"{where}: engines + trainer workers fit (rlcr.runs.cluster.check_fits on {offered})")
    except cluster.ResourceError as e:
        r.check(False, f"{where}: engines + trainer workers fit", str(e))


def check_rayjob(r: Report, doc: dict, image: str, ray_version: str, mods, where: str = "rayjob.yaml") -> None:
    meta, spec = doc.get("metadata") or {}, doc.get("spec") or {}
    r.check(doc.get("apiVersion") == "ray.io/v1" and doc.get("kind") == "RayJob", f"{where}: ray.io/v1 RayJob")
    name = meta.get("name", "")
    r.check(len(name) <= 47 and bool(DNS1035.match(name)), f"{where}: name {name!r} ≤ 47 chars, DNS-1035")
    r.check(set(spec) <= RAYJOB_SPEC_FIELDS, f"{where}: only RayJobSpec fields", str(set(spec) - RAYJOB_SPEC_FIELDS))
    mode = spec.get("submissionMode", "K8sJobMode")
    r.check(mode in SUBMISSION_MODES, f"{where}: submissionMode {mode}")
    # ValidateRayJobSpec (KubeRay v1.7.0), the rules that apply to this file
    r.check(spec.get("shutdownAfterJobFinishes") is True, f"{where}: shutdownAfterJobFinishes (GPUs freed)")
    def integer(key: str, default: int) -> int | None:
        v = spec.get(key, default)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    ttl, deadline, backoff = (integer("ttlSecondsAfterFinished", -1), integer("activeDeadlineSeconds", 1),
                              integer("backoffLimit", 0))
    r.check(ttl is not None and ttl >= 0, f"{where}: ttlSecondsAfterFinished set, a non-negative integer")
    r.check(deadline is not None and deadline > 0, f"{where}: activeDeadlineSeconds a positive integer")
    r.check(backoff is not None and backoff >= 0, f"{where}: backoffLimit a non-negative integer")
    r.check(bool(spec.get("rayClusterSpec")) != bool(spec.get("clusterSelector")),
            f"{where}: exactly one of rayClusterSpec / clusterSelector")
    if mode == "SidecarMode":
        r.check("submitterPodTemplate" not in spec and "submitterConfig" not in spec,
                f"{where}: SidecarMode takes no submitter template/config")
    if "submitterPodTemplate" in spec:
        sub = spec["submitterPodTemplate"]
        r.check((sub.get("spec") or {}).get("restartPolicy") in ("Never", "OnFailure"),
                f"{where}: submitter pod restartPolicy Never/OnFailure (it is a Job's pod)")
        subc = (containers_of(sub) or [{}])[0]
        r.check(subc.get("image") == image, f"{where}: submitter image is {image}")
        r.check(not subc.get("command"), f"{where}: submitter command left to KubeRay")
    try:
        renv = yaml.safe_load(spec.get("runtimeEnvYAML") or "") or {}
        parsed = isinstance(renv, dict)
    except yaml.YAMLError:
        renv, parsed = {}, False
    if r.check(parsed, f"{where}: runtimeEnvYAML is a YAML mapping"):
        r.check(set(renv) <= RUNTIME_ENV_FIELDS, f"{where}: runtime env uses Ray's fields only",
                str(set(renv) - RUNTIME_ENV_FIELDS))
        env_vars = renv.get("env_vars") or {}
        r.check(all(isinstance(v, str) for v in env_vars.values()), f"{where}: runtime env_vars are strings")
        clash = set(env_vars) & ensure_ray_env_vars()
        r.check(not clash, f"{where}: runtime env names no variable that rlcr.runs.cluster.ensure_ray sets",
                f"{sorted(clash)}: Ray refuses to merge a job's and a driver's runtime env on the same key")
        secrets = {k for k in env_vars if "SECRET" in k.upper() or k.upper().endswith("_KEY_ID")}
        r.check(not secrets, f"{where}: no credentials in the runtime env", str(sorted(secrets)))
    offered = {}
    if spec.get("rayClusterSpec"):
        offered = check_cluster_spec(r, where, spec["rayClusterSpec"], meta.get("annotations") or {},
                                     image, ray_version)
    got = check_entrypoint(r, spec.get("entrypoint", ""), mods, where)
    if got is not None and offered:
        check_fit(r, where, got[0], offered, mods)


def check_prefect(r: Report, doc: dict, mods, offered: dict[str, float]) -> None:
    deps = {d.get("name"): d for d in doc.get("deployments") or []}
    r.check({"train", "nightly"} <= set(deps), "prefect.yaml: deployments train and nightly")
    for name, d in deps.items():
        params = flow_parameters(d.get("entrypoint", ""))
        if r.check(params is not None, f"prefect.yaml {name}: entrypoint {d.get('entrypoint')} exists"):
            extra = set(d.get("parameters") or {}) - params
            r.check(not extra, f"prefect.yaml {name}: parameters are arguments of the flow", str(sorted(extra)))
        r.check(bool((d.get("work_pool") or {}).get("name")), f"prefect.yaml {name}: work pool named")
        over = (d.get("parameters") or {}).get("overrides") or {}
        r.check(str(over.get("storage.uri", "")).startswith("s3://"), f"prefect.yaml {name}: storage.uri on s3://")
        if mods is not None and d.get("parameters", {}).get("config"):
            config_mod = mods[0]
            try:
                cfg = config_mod.RLCRConfig.from_yaml(REPO / d["parameters"]["config"], dict(over))
                r.check(True, f"prefect.yaml {name}: config + overrides load (rlcr.config)")
                if name == "train" and offered:
                    check_fit(r, "prefect.yaml train on raycluster.yaml", cfg, offered, mods)
            except config_mod.ConfigError as e:
                r.check(False, f"prefect.yaml {name}: config + overrides load", str(e))
    env = ((deps.get("train") or {}).get("work_pool") or {}).get("job_variables", {}).get("env", {})
    r.check(bool(env.get("RAY_ADDRESS")), "prefect.yaml train: RAY_ADDRESS set for the flow runs")


# ----------------------------------------------------------------------------- CRD schema (optional)

def schema_check(r: Report, where: str, value: Any, schema: dict, path: str = "") -> None:
    """A structural check of `value` against a CRD's openAPIV3Schema: types, enums, required, unknown fields."""
    errors: list[str] = []

    def walk(v: Any, s: dict, p: str) -> None:
        if s.get("x-kubernetes-int-or-string"):
            if not isinstance(v, (int, str)) or isinstance(v, bool):
                errors.append(f"{p}: int-or-string expected, got {type(v).__name__}")
            return
        if s.get("x-kubernetes-preserve-unknown-fields") and "properties" not in s:
            return
        t = s.get("type")
        kinds = {"object": dict, "array": list, "string": str, "boolean": bool,
                 "integer": int, "number": (int, float)}
        if t in kinds and (not isinstance(v, kinds[t]) or (t in ("integer", "number") and isinstance(v, bool))):
            errors.append(f"{p or '/'}: {t} expected, got {type(v).__name__} ({v!r:.40})")
            return
        if "enum" in s and v not in s["enum"]:
            errors.append(f"{p}: {v!r} not in {s['enum']}")
        if t == "object" and isinstance(v, dict):
            for req in s.get("required") or []:
                if req not in v:
                    errors.append(f"{p}: required field {req!r} missing")
            props = s.get("properties")
            extra = s.get("additionalProperties")
            for k, sub in v.items():
                if props is not None and k in props:
                    walk(sub, props[k], f"{p}.{k}")
                elif isinstance(extra, dict):
                    walk(sub, extra, f"{p}.{k}")
                elif props is not None and not s.get("x-kubernetes-preserve-unknown-fields") and extra is not True:
                    errors.append(f"{p}: unknown field {k!r}")
        if t == "array" and isinstance(v, list) and isinstance(s.get("items"), dict):
            for i, item in enumerate(v):
                walk(item, s["items"], f"{p}[{i}]")

    walk(value, schema, path)
    r.check(not errors, f"{where}: valid against the CRD schema", "; ".join(errors[:8]))


def crd_schema(crd_dir: Path, plural: str) -> dict:
    doc = yaml.load((crd_dir / f"ray.io_{plural}.yaml").read_text(),
                    Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    versions = {v["name"]: v for v in doc["spec"]["versions"]}
    return versions["v1"]["schema"]["openAPIV3Schema"]


# ----------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crd-dir", type=Path,
                    help="directory with KubeRay's ray.io_rayjobs.yaml and ray.io_rayclusters.yaml")
    a = ap.parse_args()
    r = Report()
    docs: dict[str, dict] = {}
    for f in sorted(INFRA.glob("*.yaml")):
        try:
            loaded = list(yaml.safe_load_all(f.read_text()))
            ok = len(loaded) == 1 and isinstance(loaded[0], dict)
        except yaml.YAMLError as e:
            loaded, ok = [], False
            print(e)
        if r.check(ok, f"{f.name}: parses (one YAML document)"):
            docs[f.name] = loaded[0]
    ray_version = ray_version_pinned()
    base = dockerfile_base()
    r.check(base.startswith(f"rayproject/ray:{ray_version}-"), f"Dockerfile: base image is Ray {ray_version} ({base})")
    image = (containers_of(((docs.get("rayjob.yaml") or {}).get("spec") or {}).get("rayClusterSpec", {})
                           .get("headGroupSpec", {}).get("template") or {}) or [{}])[0].get("image", "")
    r.check(bool(image), f"one image for every pod: {image}")
    mods = rlcr_modules()
    for name in sorted(n for n in docs if n.startswith("rayjob")):  # rayjob.yaml (1.5B), rayjob-7b.yaml, ...
        check_rayjob(r, docs[name], image, ray_version, mods, where=name)
    offered: dict[str, float] = {}
    if "raycluster.yaml" in docs:
        rc = docs["raycluster.yaml"]
        r.check(rc.get("apiVersion") == "ray.io/v1" and rc.get("kind") == "RayCluster",
                "raycluster.yaml: ray.io/v1 RayCluster")
        offered = check_cluster_spec(r, "raycluster.yaml", rc.get("spec") or {},
                                     (rc.get("metadata") or {}).get("annotations") or {}, image, ray_version)
        if "rayjob.yaml" in docs:
            ours = docs["rayjob.yaml"]["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]
            theirs = rc["spec"]["workerGroupSpecs"][0]["template"]
            same = lambda t: ({k: v for k, v in env_map(containers_of(t)[0]).items()},  # noqa: E731
                              containers_of(t)[0].get("resources"), containers_of(t)[0].get("volumeMounts"),
                              t["spec"].get("volumes"))
            a_env, *a_rest = same(ours)
            b_env, *b_rest = same(theirs)
            common = {k: v for k, v in a_env.items() if k in b_env}
            r.check(a_rest == b_rest and all(b_env[k] == v for k, v in common.items()) and
                    {"AWS_ACCESS_KEY_ID", "RLCR_CACHE", "TMPDIR"} <= set(common),
                    "rayjob.yaml and raycluster.yaml: same GPU pod (env, resources, volumes)")
    if "probe-worker.yaml" in docs:
        pw = docs["probe-worker.yaml"]
        check_pod(r, "probe-worker.yaml", (pw.get("spec") or {}).get("template") or {}, ray_start=None, image=image)
    if "prefect.yaml" in docs:
        check_prefect(r, docs["prefect.yaml"], mods, offered)
    if a.crd_dir:
        for name in sorted(n for n in docs if n.startswith("rayjob")):
            schema_check(r, name, docs[name], crd_schema(a.crd_dir, "rayjobs"))
        if "raycluster.yaml" in docs:
            schema_check(r, "raycluster.yaml", docs["raycluster.yaml"], crd_schema(a.crd_dir, "rayclusters"))
    print(f"\n{r.passed} passed, {len(r.failed)} failed")
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main())
