{{/*
Chart name, truncated to the 63 characters of a DNS label.
*/}}
{{- define "topo-device-plugin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the objects. The ConfigMap adds "-config" to it, so it is cut at 56.
*/}}
{{- define "topo-device-plugin.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 56 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 56 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 56 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "topo-device-plugin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object.
*/}}
{{- define "topo-device-plugin.labels" -}}
helm.sh/chart: {{ include "topo-device-plugin.chart" . }}
{{ include "topo-device-plugin.selectorLabels" . }}
app.kubernetes.io/version: {{ include "topo-device-plugin.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: device-plugin
app.kubernetes.io/part-of: topo-device-plugin
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels: stable across upgrades (a DaemonSet's selector is immutable).
*/}}
{{- define "topo-device-plugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "topo-device-plugin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "topo-device-plugin.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "topo-device-plugin.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "topo-device-plugin.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion | toString }}
{{- end }}

{{- define "topo-device-plugin.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "topo-device-plugin.imageTag" .) }}
{{- end }}
{{- end }}

{{/*
The kubelet root dir without a trailing slash, and the device-plugin dir inside it.
*/}}
{{- define "topo-device-plugin.kubeletRootDir" -}}
{{- .Values.kubeletRootDir | trimSuffix "/" }}
{{- end }}

{{- define "topo-device-plugin.devicePluginDir" -}}
{{- printf "%s/device-plugins" (include "topo-device-plugin.kubeletRootDir" .) }}
{{- end }}

{{- define "topo-device-plugin.configMapName" -}}
{{- .Values.config.existingConfigMap | default (printf "%s-config" (include "topo-device-plugin.fullname" .)) }}
{{- end }}

{{/*
The daemon's config file. `version` comes first; the sections follow in a fixed order.
*/}}
{{- define "topo-device-plugin.config" -}}
version: v1
{{- range $section := list "flags" "gpus" "nics" "sharing" "imex" }}
{{- with index $.Values.config $section }}
{{ $section }}:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Rolls the pods when the config changes. With an existing ConfigMap only its name is known.
*/}}
{{- define "topo-device-plugin.configChecksum" -}}
{{- if .Values.config.existingConfigMap }}
{{- .Values.config.existingConfigMap | sha256sum }}
{{- else }}
{{- include "topo-device-plugin.config" . | sha256sum }}
{{- end }}
{{- end }}

{{- define "topo-device-plugin.metricsAddress" -}}
{{- if contains ":" .Values.metrics.bindAddress }}
{{- printf "[%s]:%d" .Values.metrics.bindAddress (int .Values.metrics.port) }}
{{- else }}
{{- printf "%s:%d" .Values.metrics.bindAddress (int .Values.metrics.port) }}
{{- end }}
{{- end }}

{{/*
"true" when Allocate names devices through CDI (config.flags.deviceListStrategy has cdi-cri or
cdi-annotations): the daemon then writes its CDI specs to the host's /var/run/cdi.
*/}}
{{- define "topo-device-plugin.cdiEnabled" -}}
{{- $s := .Values.config.flags.deviceListStrategy | default "envvar" }}
{{- $l := ternary (list $s) $s (kindIs "string" $s) }}
{{- if or (has "cdi-cri" $l) (has "cdi-annotations" $l) }}true{{ end }}
{{- end }}

{{/* "true" when the daemon reads NVIDIA's toolkit's CDI spec from /etc/cdi: DRA names its devices
(dra.toolkitCdi) or the device plugin names them with cdiSpecs external (a CDI strategy), and
config.flags.toolkitCdiDirs (default /etc/cdi,/var/run/cdi) has /etc/cdi. It is then mounted read-only;
/var/run/cdi is mounted whenever CDI or DRA is on. */}}
{{- define "topo-device-plugin.toolkitSpecs" -}}
{{- $dirs := .Values.config.flags.toolkitCdiDirs | default (list "/etc/cdi" "/var/run/cdi") }}
{{- $dirs = ternary (splitList "," (toString $dirs)) $dirs (kindIs "string" $dirs) }}
{{- if and (has "/etc/cdi" $dirs) (or (and (include "topo-device-plugin.draEnabled" .) (ne (toString .Values.dra.toolkitCdi) "off")) (and (include "topo-device-plugin.cdiEnabled" .) (eq (toString .Values.config.flags.cdiSpecs) "external"))) }}true{{ end }}
{{- end }}

{{- define "topo-device-plugin.metricsServiceEnabled" -}}
{{- if or .Values.metrics.service.enabled .Values.metrics.serviceMonitor.enabled }}true{{ end }}
{{- end }}

{{/*
Container securityContext. Default: root (see values.yaml), every capability dropped,
read-only root filesystem, no privilege escalation. Opt-ins: added capabilities, or
privileged for vfio/devlink (Kubernetes rejects privileged together with
allowPrivilegeEscalation=false, so that field follows).
*/}}
{{- define "topo-device-plugin.securityContext" -}}
privileged: {{ .Values.privileges.privileged }}
allowPrivilegeEscalation: {{ .Values.privileges.privileged }}
readOnlyRootFilesystem: true
runAsUser: {{ int .Values.securityContext.runAsUser }}
runAsGroup: {{ int .Values.securityContext.runAsGroup }}
runAsNonRoot: {{ ne (int .Values.securityContext.runAsUser) 0 }}
capabilities:
  drop: [ALL]
  {{- $add := .Values.privileges.capabilities | default list }}
  {{- if include "topo-device-plugin.netdevAttach" . }}
  {{- /* moving/configuring links (both namespaces); setns into the pod's namespace */}}
  {{- $add = concat $add (list "NET_ADMIN" "SYS_ADMIN") | uniq }}
  {{- end }}
  {{- with $add }}
  add:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* "true" when some resource is served through DRA (dra.resources not empty). */}}
{{- define "topo-device-plugin.draEnabled" -}}
{{- if .Values.dra.resources }}true{{ end }}
{{- end }}

{{/* "true" when the DRA driver moves NICs into pods (dra.netdevAttach auto, with a NIC resource in
dra.resources): the daemon gets --netdev-attach=auto, the host network, NET_ADMIN + SYS_ADMIN, the NRI
socket and the pod namespaces, and RBAC on resourceclaims/status. */}}
{{- define "topo-device-plugin.netdevAttach" -}}
{{- if and (include "topo-device-plugin.draEnabled" .) (eq (toString .Values.dra.netdevAttach) "auto") }}
{{- $gpu := (include "topo-device-plugin.option" (dict "root" . "key" "gpuResourceName" "flag" "--gpu-resource-name" "default" "nvidia.com/gpu") | fromJson).value }}
{{- if without .Values.dra.resources $gpu }}true{{ end }}
{{- end }}
{{- end }}

{{/* "true" when the daemon calls the API server: the DRA driver, the Node label (fabricLabels.node), or the
NodeResourceTopology (nrt.enabled). */}}
{{- define "topo-device-plugin.apiAccess" -}}
{{- if or (include "topo-device-plugin.draEnabled" .) .Values.fabricLabels.node .Values.nrt.enabled }}true{{ end }}
{{- end }}

{{/* The NFD feature file the daemon keeps the clique label in (fabricLabels.nfdFile). */}}
{{- define "topo-device-plugin.nfdFeatureFile" -}}
{{ trimSuffix "/" .Values.fabricLabels.nfdFeaturesDir }}/topo-device-plugin-clique
{{- end }}

{{/* The DRA driver's name: fixed in the daemon (plugin/dra/slices.py SliceOptions.driver_name). */}}
{{- define "topo-device-plugin.draDriver" -}}
topo.dev
{{- end }}

{{/* (Used by _validate.tpl and dra-deviceclasses.yaml.) An option as the daemon resolves it (plugin/cli/options.py resolve: flag > TOPO_DP_<OPTION> >
config file > default), from the last `--flag=V` of extraArgs (the schema wants every item to start
with '-', so `--flag V` cannot be given), else the last plain
`value` of that variable in extraEnv, else config.flags: JSON {value, where}. Input: {root, key, flag,
default}. */}}
{{- define "topo-device-plugin.option" -}}
{{- $value := index (.root.Values.config.flags | default dict) .key | default .default | toString }}
{{- $where := printf "config.flags.%s" .key }}
{{- $env := printf "TOPO_DP_%s" (snakecase .key | upper) }}
{{- range .root.Values.extraEnv | default list }}
{{- if and (eq (toString .name) $env) (hasKey . "value") }}
{{- $value = toString .value }}
{{- $where = "extraEnv" }}
{{- end }}
{{- end }}
{{- range .root.Values.extraArgs | default list }}
{{- if hasPrefix (printf "%s=" $.flag) . }}
{{- $value = trimPrefix (printf "%s=" $.flag) . }}
{{- $where = "extraArgs" }}
{{- end }}
{{- end }}
{{- toJson (dict "value" $value "where" $where) }}
{{- end }}

{{/*
The MPS root the daemon uses, when it may run MPS control daemons (sharing.mps in the config, DRA, or
config.flags.mpsRoot set); empty otherwise. The daemon's default is NVIDIA's /run/nvidia/mps.
*/}}
{{- define "topo-device-plugin.mpsRoot" -}}
{{- $flags := .Values.config.flags | default dict }}
{{- $sharing := .Values.config.sharing | default dict }}
{{- if $flags.mpsRoot }}{{ $flags.mpsRoot }}
{{- else if or $sharing.mps (include "topo-device-plugin.draEnabled" .) }}/run/nvidia/mps
{{- end }}
{{- end }}

{{/*
"true" when the pod mounts the host's IMEX control program and socket directory (dra.imexHost): DRA on,
host-managed IMEX channels published (draImexChannels > 0), a real node (no simulate), and the program
not chosen by the operator (config.flags.imexControlBinary, its env variable or flag).
*/}}
{{- define "topo-device-plugin.imexHost" -}}
{{- $channels := (include "topo-device-plugin.option" (dict "root" . "key" "draImexChannels" "flag" "--dra-imex-channels" "default" "0") | fromJson).value }}
{{- $binary := include "topo-device-plugin.option" (dict "root" . "key" "imexControlBinary" "flag" "--imex-control-binary" "default" "") | fromJson }}
{{- $chosen := or (hasKey (.Values.config.flags | default dict) "imexControlBinary") (ne $binary.where "config.flags.imexControlBinary") }}
{{- if and (include "topo-device-plugin.draEnabled" .) (gt (atoi $channels) 0) (not .Values.simulate) .Values.dra.imexHost.enabled (not $chosen) }}true{{- end }}
{{- end }}
