#!/usr/bin/env python3
"""Validates rendered Kubernetes objects: built-in kinds with kubernetes-validate (its offline schemas, strict:
unknown fields are errors); the custom resources batchd ships (ServiceMonitor, ScaledObject) are written to
CRDS_OUT as JSON for validate-crds.mjs, which checks them against validators generated from their published CRDs.

Usage: validate.py KUBERNETES_VERSION CRDS_OUT RENDERED.yaml...
"""
import json
import sys

import kubernetes_validate
import yaml

CUSTOM = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("keda.sh/v1alpha1", "ScaledObject"),
}


def main():
    version, crds_out, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    failures, custom, checked = 0, [], 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            for obj in (doc for doc in yaml.safe_load_all(f) if doc):
                name = f"{path}: {obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
                if (obj.get("apiVersion"), obj.get("kind")) in CUSTOM:
                    custom.append({"source": name, "object": obj})
                    continue
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                    checked += 1
                    print(f"ok    {name} (kubernetes {version}, strict)")
                except Exception as error:  # SchemaNotFoundError too: an unknown kind is a failure here
                    failures += 1
                    print(f"FAIL  {name}: {error}")
    with open(crds_out, "w", encoding="utf-8") as f:
        json.dump(custom, f)
    if failures or not checked:
        sys.exit(f"{failures} object(s) failed validation" if failures else "nothing was validated")


if __name__ == "__main__":
    main()
