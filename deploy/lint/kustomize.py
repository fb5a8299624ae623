#!/usr/bin/env python3
"""A small kustomize renderer for the features deploy/kubernetes uses, for machines without `kubectl kustomize`.

Supports: resources (files and directories), namespace, images (newName/newTag/digest), configMapGenerator (files;
behavior create/replace; the same content-hash name suffix as kustomize, and references to the generated name in
pod templates), and patches given as strategic-merge files (maps merged, lists of named items merged by name,
other lists replaced). Anything else in a kustomization is an error, never silently ignored.
`scripts/lint-deploy.sh` compares its output with `kubectl kustomize` wherever kubectl exists, so the two
cannot drift apart unnoticed.

Usage: kustomize.py DIR  (prints the rendered objects as a YAML stream)
"""
import copy
import hashlib
import json
import os
import sys

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "images", "configMapGenerator", "patches"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass",
                  "StorageClass", "PersistentVolume", "ValidatingWebhookConfiguration",
                  "MutatingWebhookConfiguration"}


def fail(message):
    sys.exit(f"kustomize.py: {message}")


def load_yaml_stream(path):
    with open(path, encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def config_map_hash(config_map):
    """kustomize's name suffix: sha256 of the Go JSON encoding of {data, kind, name}, first 10 hex digits, with
    0, 1, 3, a and e replaced so the suffix never looks like a number or a word. kustomize 5 looks the name up
    as one field literally called "metadata/name", finds nothing and hashes "" (checked against kubectl 1.32)."""
    encoded = {"data": config_map.get("data", {}), "kind": "ConfigMap", "name": ""}
    text = json.dumps(encoded, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # Go's encoding/json escapes these (HTML safety); the hash must see the same bytes.
    for char, escape in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]
    return digest.translate(str.maketrans({"0": "g", "1": "h", "3": "k", "a": "m", "e": "t"}))


def strategic_merge(base, patch):
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = strategic_merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and all(
            isinstance(item, dict) and "name" in item for item in base + patch):
        merged = [copy.deepcopy(item) for item in base]
        for item in patch:
            for i, existing in enumerate(merged):
                if existing["name"] == item["name"]:
                    merged[i] = strategic_merge(existing, item)
                    break
            else:
                merged.append(copy.deepcopy(item))
        return merged
    return copy.deepcopy(patch)


def pod_spec(obj):
    if obj.get("kind") in {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}:
        return obj.get("spec", {}).get("template", {}).get("spec")
    if obj.get("kind") == "CronJob":
        return obj.get("spec", {}).get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec")
    return None


def containers(spec):
    return (spec.get("containers") or []) + (spec.get("initContainers") or [])


def render(directory):
    path = os.path.join(directory, "kustomization.yaml")
    with open(path, encoding="utf-8") as f:
        kustomization = yaml.safe_load(f)
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        fail(f"{path}: unsupported fields {sorted(unknown)}")
    objects = []
    for resource in kustomization.get("resources", []):
        target = os.path.join(directory, resource)
        objects.extend(render(target) if os.path.isdir(target) else load_yaml_stream(target))

    for generator in kustomization.get("configMapGenerator", []):
        unknown = set(generator) - {"name", "files", "behavior"}
        if unknown:
            fail(f"{path}: configMapGenerator fields {sorted(unknown)} unsupported")
        data = {}
        for entry in generator.get("files", []):
            key, _, file = entry.rpartition("=") if "=" in entry else (os.path.basename(entry), "", entry)
            with open(os.path.join(directory, file), encoding="utf-8") as f:
                data[key] = f.read()
        name = generator["name"]
        behavior = generator.get("behavior", "create")
        existing = [o for o in objects if o.get("kind") == "ConfigMap" and o.get("_generated_from") == name]
        if behavior == "create" and existing:
            fail(f"{path}: ConfigMap {name} generated twice")
        if behavior == "replace" and not existing:
            fail(f"{path}: ConfigMap {name} to replace does not exist")
        if behavior not in {"create", "replace"}:
            fail(f"{path}: configMapGenerator behavior {behavior} unsupported")
        objects = [o for o in objects if o not in existing]
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data,
                        "_generated_from": name})

    for patch in kustomization.get("patches", []):
        if set(patch) != {"path"}:
            fail(f"{path}: only `patches: - path: FILE` (strategic merge) is supported")
        for doc in load_yaml_stream(os.path.join(directory, patch["path"])):
            targets = [o for o in objects if o.get("kind") == doc.get("kind")
                       and o["metadata"]["name"] == doc["metadata"]["name"]]
            if len(targets) != 1:
                fail(f"{path}: patch {patch['path']} matches {len(targets)} objects")
            objects[objects.index(targets[0])] = strategic_merge(targets[0], doc)

    for image in kustomization.get("images", []):
        for obj in objects:
            spec = pod_spec(obj)
            for container in containers(spec) if spec else []:
                name, _, tag = container["image"].partition(":")
                if name == image["name"]:
                    new_name = image.get("newName", name)
                    new_tag = image.get("newTag", tag)
                    if "digest" in image:  # kustomize: a digest replaces the tag
                        container["image"] = f"{new_name}@{image['digest']}"
                    else:
                        container["image"] = f"{new_name}:{new_tag}" if new_tag else new_name

    if "namespace" in kustomization:
        for obj in objects:
            if obj.get("kind") not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = kustomization["namespace"]
    return objects


def finish(objects):
    """Names generated ConfigMaps with their content hash and points pod templates at the new names."""
    renames = {}
    for obj in objects:
        source = obj.pop("_generated_from", None)
        if source:
            obj["metadata"]["name"] = f"{source}-{config_map_hash(obj)}"
            renames[source] = obj["metadata"]["name"]
    for obj in objects:
        spec = pod_spec(obj)
        if not spec:
            continue
        for volume in spec.get("volumes") or []:
            if "configMap" in volume and volume["configMap"].get("name") in renames:
                volume["configMap"]["name"] = renames[volume["configMap"]["name"]]
        for container in containers(spec):
            for source in container.get("envFrom") or []:
                ref = source.get("configMapRef")
                if ref and ref.get("name") in renames:
                    ref["name"] = renames[ref["name"]]
            for env in container.get("env") or []:
                ref = (env.get("valueFrom") or {}).get("configMapKeyRef")
                if ref and ref.get("name") in renames:
                    ref["name"] = renames[ref["name"]]
    return objects


if __name__ == "__main__":
    if len(sys.argv) != 2:
        fail("usage: kustomize.py DIR")
    yaml.safe_dump_all(finish(render(sys.argv[1])), sys.stdout, sort_keys=False)
