// Validates the custom resources batchd ships against validators generated from their published CRD schemas
// (npm @kubernetes-models/keda and @kubernetes-models/prometheus-operator, pinned in scripts/lint-deploy.sh):
// types, required fields and enums. These schemas do not forbid unknown fields, so a misspelt optional field
// passes here (stated in docs/operations.md).
// Usage: node validate-crds.mjs CRDS.json   (written by validate.py)
import { readFileSync } from "node:fs";
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";

const models = { ScaledObject, ServiceMonitor, PrometheusRule };
const objects = JSON.parse(readFileSync(process.argv[2], "utf8"));
let failures = 0;
for (const { source, object } of objects) {
  try {
    new models[object.kind](object).validate();
    console.log(`ok    ${source} (published CRD schema)`);
  } catch (error) {
    failures += 1;
    console.log(`FAIL  ${source}: ${error.message}`);
  }
}
if (objects.length === 0) {
  console.error("no custom resources to validate");
  process.exit(1);
}
process.exit(failures ? 1 : 0);
