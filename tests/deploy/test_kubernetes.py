"""examples/kubernetes/grade-job.yaml against the batch/v1 Job schema, and the three Jobs against
each other. It was never run on a cluster: this is all that is checked.

The schema is the part of the Kubernetes API reference (Job, JobSpec, PodTemplateSpec, PodSpec,
Container; https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/job-v1/) these
Jobs use, with every documented field of JobSpec, and the API server's validation rules for Jobs:
restartPolicy Never or OnFailure, `completions` set for an Indexed Job, backoffLimitPerIndex and
maxFailedIndexes only on an Indexed Job whose pods restart Never."""

import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

YAML = Path(__file__).resolve().parents[2] / "examples" / "kubernetes" / "grade-job.yaml"
DNS_LABEL = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
INT = {"type": "integer", "minimum": 0}
QUANTITY = {"type": "string", "pattern": r"^[0-9.]+(m|Ki|Mi|Gi|Ti|k|M|G|T)?$"}
STRINGS = {"type": "array", "items": {"type": "string"}}
META = {
    "type": "object",
    "properties": {
        "name": DNS_LABEL,
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object"},
    },
}
CONTAINER = {
    "type": "object",
    "required": ["name", "image"],
    "additionalProperties": False,
    "properties": {
        "name": DNS_LABEL,
        "image": {"type": "string", "minLength": 1},
        "command": STRINGS,
        "args": STRINGS,
        "workingDir": {"type": "string"},
        "imagePullPolicy": {"enum": ["Always", "Never", "IfNotPresent"]},
        "env": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "value": {"type": "string"},
                    "valueFrom": {"type": "object"},
                },
            },
        },
        "resources": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "requests": {"type": "object", "additionalProperties": QUANTITY},
                "limits": {"type": "object", "additionalProperties": QUANTITY},
            },
        },
        "volumeMounts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "mountPath"],
                "additionalProperties": False,
                "properties": {
                    "name": DNS_LABEL,
                    "mountPath": {"type": "string"},
                    "readOnly": {"type": "boolean"},
                    "subPath": {"type": "string"},
                },
            },
        },
        "securityContext": {"type": "object"},
    },
}
POD_SPEC = {
    "type": "object",
    "required": ["containers"],
    "additionalProperties": False,
    "properties": {
        "containers": {"type": "array", "minItems": 1, "items": CONTAINER},
        "initContainers": {"type": "array", "items": CONTAINER},
        "restartPolicy": {"enum": ["Never", "OnFailure"]},  # a Job's pods may not restart Always
        "volumes": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": DNS_LABEL,
                    "persistentVolumeClaim": {
                        "type": "object",
                        "required": ["claimName"],
                        "additionalProperties": False,
                        "properties": {"claimName": {"type": "string"}, "readOnly": {"type": "boolean"}},
                    },
                },
            },
        },
        "securityContext": {"type": "object"},
        "serviceAccountName": {"type": "string"},
        "nodeSelector": {"type": "object"},
        "tolerations": {"type": "array"},
        "affinity": {"type": "object"},
        "activeDeadlineSeconds": INT,
        "automountServiceAccountToken": {"type": "boolean"},
    },
}
JOB_SPEC = {
    "type": "object",
    "required": ["template"],
    "additionalProperties": False,
    "properties": {
        "activeDeadlineSeconds": INT,
        "backoffLimit": INT,
        "backoffLimitPerIndex": INT,
        "completionMode": {"enum": ["NonIndexed", "Indexed"]},
        "completions": INT,
        "managedBy": {"type": "string"},
        "manualSelector": {"type": "boolean"},
        "maxFailedIndexes": INT,
        "parallelism": INT,
        "podFailurePolicy": {"type": "object"},
        "podReplacementPolicy": {"enum": ["TerminatingOrFailed", "Failed"]},
        "selector": {"type": "object"},
        "successPolicy": {"type": "object"},
        "suspend": {"type": "boolean"},
        "ttlSecondsAfterFinished": INT,
        "template": {
            "type": "object",
            "required": ["spec"],
            "additionalProperties": False,
            "properties": {"metadata": META, "spec": POD_SPEC},
        },
    },
    "allOf": [
        {
            "if": {"required": ["completionMode"], "properties": {"completionMode": {"const": "Indexed"}}},
            "then": {"required": ["completions"]},
        },
        {
            "if": {"anyOf": [{"required": ["backoffLimitPerIndex"]}, {"required": ["maxFailedIndexes"]}]},
            "then": {
                "required": ["completionMode", "backoffLimitPerIndex"],
                "properties": {
                    "completionMode": {"const": "Indexed"},
                    "template": {
                        "properties": {
                            "spec": {"required": ["restartPolicy"], "properties": {"restartPolicy": {"const": "Never"}}}
                        }
                    },
                },
            },
        },
    ],
}
JOB = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {"apiVersion": {"const": "batch/v1"}, "kind": {"const": "Job"}, "metadata": META, "spec": JOB_SPEC},
}


@pytest.fixture(scope="module")
def jobs():
    docs = [d for d in yaml.safe_load_all(YAML.read_text()) if d]
    return {d["metadata"]["name"]: d for d in docs}


def container(job):
    return job["spec"]["template"]["spec"]["containers"][0]


def command(job):
    c = container(job)
    return " ".join(c.get("command", []) + c.get("args", []))


def env(job):
    return {e["name"]: e["value"] for e in container(job).get("env", [])}


def test_every_job_matches_the_job_schema(jobs):
    assert list(jobs) == ["mha-manifest", "mha-grade", "mha-merge"]
    for job in jobs.values():
        jsonschema.validate(job, JOB)


def test_the_schema_rejects_what_the_api_server_rejects(jobs):
    grade = jobs["mha-grade"]
    broken = [
        dict(grade, spec={k: v for k, v in grade["spec"].items() if k != "completions"}),  # Indexed needs completions
        dict(grade, spec=dict(grade["spec"], completionMode="indexed")),
        dict(grade, spec=dict(grade["spec"], completion_mode="Indexed")),
        dict(
            grade,
            spec=dict(
                grade["spec"], template={"spec": dict(grade["spec"]["template"]["spec"], restartPolicy="Always")}
            ),
        ),
    ]
    for job in broken:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(job, JOB)


def test_grade_is_an_indexed_job_whose_pods_grade_one_shard_each(jobs):
    grade = jobs["mha-grade"]
    spec = grade["spec"]
    assert spec["completionMode"] == "Indexed" and spec["template"]["spec"]["restartPolicy"] == "Never"
    assert int(env(grade)["SHARDS"]) == spec["completions"] == int(env(jobs["mha-merge"])["SHARDS"])
    args = shlex.split(command(grade).replace('"', ""))
    assert args[args.index("--shard") + 1] == "$JOB_COMPLETION_INDEX/$SHARDS"
    assert args[args.index("--out") + 1] == "/data/shard_$JOB_COMPLETION_INDEX" and "--resume" in args


def test_the_three_jobs_share_one_volume_and_one_manifest(jobs):
    claims = {
        v["persistentVolumeClaim"]["claimName"] for j in jobs.values() for v in j["spec"]["template"]["spec"]["volumes"]
    }
    assert len(claims) == 1
    manifest = re.search(r"--out (\S+)", command(jobs["mha-manifest"])).group(1)
    for name in ("mha-grade", "mha-merge"):
        assert f"--manifest {manifest}" in command(jobs[name])
    assert "seq -f /data/shard_%g 0 $((SHARDS - 1))" in command(jobs["mha-merge"])  # every index, so a gap is seen


def test_every_shard_and_the_merge_sign_with_one_key_outside_results(jobs):
    """The shards' verdicts are signed with the key MHA_RESULTS_KEY names; merge refuses any it cannot verify,
    so every pod must name the same key, on the shared volume and outside each RESULTS folder."""
    keys = {env(jobs[name]).get("MHA_RESULTS_KEY") for name in ("mha-grade", "mha-merge")}
    assert len(keys) == 1 and None not in keys, keys
    key = keys.pop()
    assert key.startswith("/data/") and not key.startswith(("/data/shard_", "/data/merged")), key
