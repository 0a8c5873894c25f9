{{/*
Scheduling that follows the GPU Operator's node labels (values gpuOperator.*, docs/gpu-operator.md).

The pause values are the ones NVIDIA's tools write: mig-manager sets a deploy label to
`paused-for-mig-change` (keeping `false`) and restores `true`; the driver manager sets
`paused-for-driver-upgrade`, or appends `_paused-for-driver-upgrade` to a value that is neither
`true` nor `false` (so a MIG pause in progress reads `paused-for-mig-change_paused-for-driver-upgrade`).
NotIn also matches nodes without the label, which is why the affinity is harmless where no GPU
Operator runs.
*/}}
{{- define "topo-device-plugin.deployLabelPauses" -}}
{{- list "paused-for-mig-change" "paused-for-driver-upgrade" "paused-for-mig-change_paused-for-driver-upgrade" | toJson }}
{{- end }}

{{/*
The pods' nodeSelector: the user's, plus `nvidia.com/gpu.deploy.client: "true"` with
gpuOperator.gpuClientNodeSelector (mig-manager and the driver manager wait only for DaemonSet pods
whose nodeSelector names that key).
*/}}
{{- define "topo-device-plugin.nodeSelector" -}}
{{- $selector := deepCopy (.Values.nodeSelector | default dict) }}
{{- if .Values.gpuOperator.gpuClientNodeSelector }}
{{- $_ := set $selector "nvidia.com/gpu.deploy.client" "true" }}
{{- end }}
{{- with $selector }}{{ toYaml . }}{{ end }}
{{- end }}

{{/*
The pods' affinity: the user's, with gpuOperator.honourDeployLabels adding the two NotIn
requirements to every required node-selector term (terms are ORed, so each needs them), or one
term of them when the user gave none.
*/}}
{{- define "topo-device-plugin.affinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) }}
{{- if .Values.gpuOperator.honourDeployLabels }}
{{- $pauses := include "topo-device-plugin.deployLabelPauses" . | fromJsonArray }}
{{- $requirements := list }}
{{- range $key := list "nvidia.com/gpu.deploy.device-plugin" "nvidia.com/gpu.deploy.client" }}
{{- $requirements = append $requirements (dict "key" $key "operator" "NotIn" "values" $pauses) }}
{{- end }}
{{- $nodeAffinity := get $affinity "nodeAffinity" | default dict }}
{{- $required := get $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" | default dict }}
{{- $terms := get $required "nodeSelectorTerms" | default (list dict) }}
{{- $merged := list }}
{{- range $terms }}
{{- $term := deepCopy . }}
{{- $_ := set $term "matchExpressions" (concat (get $term "matchExpressions" | default list) $requirements) }}
{{- $merged = append $merged $term }}
{{- end }}
{{- $_ := set $required "nodeSelectorTerms" $merged }}
{{- $_ := set $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" $required }}
{{- $_ := set $affinity "nodeAffinity" $nodeAffinity }}
{{- end }}
{{- with $affinity }}{{ toYaml . }}{{ end }}
{{- end }}
