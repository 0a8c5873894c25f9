{{/*
Start-up refusals of the daemon, made at `helm install` / `helm template` time.

Why: a combination the daemon refuses at start (say DRA and time-slicing on the GPU resource)
would otherwise render, install, and crash-loop on every node. Each rule below is one the
daemon applies to the config and flags this chart renders, checked here in the daemon's own
order, with the daemon's own message: `<values path>: <the daemon's text after its location>`
(the daemon names the rendered file and line, or `--dra-resources`; a chart user set a value).
tests/chart/test_chart_refusals.py renders every rule here and runs the daemon on the same
config, so the chart's text cannot drift from the daemon's.

Rules (daemon source):
- sharing.mps and sharing.timeSlicing together are refused (plugin/config/sharing.py parse_sharing)
- NIC pools (plugin/model/nic_pools/config.py): `<prefix>/<resourceName>` must be a valid extended
  resource name and unique; pfNames/rootDevices items `PF[#indexes]` must name a PF (a PCI
  address for rootDevices), have at most one '#', indexes and ranges `a-b` with a <= b after it,
  and no PF twice in one list; a selector may not ask for isRdma on vfio-pci functions only
- gpuResourceName and nicResourceName must be valid extended resource names
  (plugin/model/resource_names.py, checked by plugin/model/resources.py ResourceOptions)
- dra.resources: each name must be a resource of this configuration; the GPU resource through DRA
  needs migStrategy none and no time-slicing (plugin/model/serving_modes.py check_modes)
- sharing.timeSlicing.resources: the name must be the GPU resource or a MIG resource of its
  domain, the replicas' name (rename, or <name>.shared) a valid resource name, and no two
  resources' replicas may share a name (plugin/model/time_slicing.py plan_time_slicing)
The shape of sharing.timeSlicing (replicas >= 2, devices ...) is values.schema.json's.

Chart-only rules (topo-device-plugin.validateMapping; checked with existingConfigMap too): the
daemon never sees dra.extendedResources, which only adds `extendedResourceName` to the chart's
DeviceClasses (docs/migrating-to-dra.md). It is the same mode rule seen from the scheduler: a
node serves a name one way.
- each name must be in dra.resources: a name the device plugin serves here is advertised by the
  node, and a class mapping it would stand for devices this release never publishes;
- dra.deviceClasses must be on (the mapping is a field of those classes);
- a NIC name only while it is the one NIC resource through DRA: nic.<driver> selects every NIC the
  driver publishes, so with two NIC pools through DRA it would hand out the other pool's NICs.

Not checked here, because they depend on the node's hardware (the daemon refuses them at start
on the node where they occur):
- migStrategy single with GPUs in MIG mode without MIG devices, with more than one MIG
  profile, or with some GPUs not in MIG mode; migStrategy mixed with a MIG profile whose
  compute instance is smaller than its GPU instance (plugin/model/mig_strategy.py)
- time-slicing `devices:` against the node: a count above the GPUs there, an index or UUID the
  node does not have, a partial selection that keeps the resource's name, a device shared by two
  entries (plugin/model/time_slicing.py)
- a resource name served twice, e.g. gpuResourceName equal to a NIC pool's name: only when the
  node has devices of both (plugin/model/resources.py build_resources)
- duplicate device IDs in the node's topology, NVML start-up (failOnInitError), an unusable DRA
  checkpoint, no API server (plugin/model/resources.py, plugin/sources, plugin/dra)
Options the rules read (gpuResourceName, nicResourceName, migStrategy) are taken as the daemon
takes them: extraArgs over extraEnv over config.flags. Not seen: an extraEnv value from valueFrom,
other options in extraArgs or extraEnv (the config file's NIC pools and sharing cannot be set
there), and the contents of config.existingConfigMap (no rule is checked when it is set).
*/}}

{{/* The daemon's message for an invalid extended resource name (plugin/model/resource_names.py). */}}
{{- define "topo-device-plugin.resourceNameError" -}}
{{- $ok := regexMatch "^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$" . }}
{{- if or (not $ok) (contains "kubernetes.io/" .) (hasPrefix "requests." .) -}}
resource name '{{ . }}' is not a valid extended resource name (want <lowercase.domain>/<name>, not under kubernetes.io, e.g. nvidia.com/gpu)
{{- end }}
{{- end }}

{{/* `gpu` -> `<domain>/gpu`: NVIDIA's qualification of a time-slicing name (plugin/config/sharing.py qualify). */}}
{{- define "topo-device-plugin.qualify" -}}
{{- if contains "/" .name }}{{ .name }}{{ else }}{{ printf "%s/%s" .domain .name }}{{ end }}
{{- end }}

{{/* Python's repr() of a string, clipped to 80 characters as the daemon's messages clip it (plugin/errors.py shorten). */}}
{{- define "topo-device-plugin.repr" -}}
{{- $s := replace "\\" "\\\\" (toString .) }}
{{- $r := "" }}
{{- if and (contains "'" $s) (not (contains "\"" $s)) }}
{{- $r = printf "\"%s\"" $s }}
{{- else }}
{{- $r = printf "'%s'" (replace "'" "\\'" $s) }}
{{- end }}
{{- if gt (len $r) 80 }}{{ printf "%s…%s" (substr 0 75 $r) (substr (int (sub (len $r) 4)) (len $r) $r) }}{{ else }}{{ $r }}{{ end }}
{{- end }}

{{/* The daemon's checks of a pfNames/rootDevices list, `PF[#indexes]` items (plugin/model/nic_pools/config.py
vf_ranges): {path, kind, items}. */}}
{{- define "topo-device-plugin.checkVfRanges" -}}
{{- $example := ternary "ens1f0#0,2-7" "0000:3b:00.0#0,2-7" (eq .kind "pfNames") }}
{{- $seen := dict }}
{{- range $i, $raw := .items }}
{{- $p := printf "config.%s[%d]" $.path $i }}
{{- $item := toString $raw }}
{{- $r := include "topo-device-plugin.repr" $item }}
{{- $parts := splitList "#" $item }}
{{- $head := first $parts | trim }}
{{- if not $head }}
{{- fail (printf "%s: %s names no PF (fix: write the PF before '#', e.g. '%s')" $p $r $example) }}
{{- end }}
{{- $pf := lower $head }}
{{- if eq $.kind "rootDevices" }}
{{- if not (regexMatch "^([0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]$" $head) }}
{{- fail (printf "%s: %s is not a PCI address (fix: write domain:bus:device.function, e.g. '0000:3b:00.2')" $p (include "topo-device-plugin.repr" $head)) }}
{{- end }}
{{- $pf = lower (ternary $head (printf "0000:%s" $head) (regexMatch "^[0-9a-fA-F]{4}:" $head)) }}
{{- end }}
{{- if gt (len $parts) 1 }}
{{- if gt (len $parts) 2 }}
{{- fail (printf "%s: %s has more than one '#' (fix: write one '#', e.g. '%s')" $p $r $example) }}
{{- end }}
{{- $tail := index $parts 1 }}
{{- if not (trim $tail) }}
{{- fail (printf "%s: %s has no VF index after '#' (fix: list VF indexes or ranges after '#', e.g. '%s', or drop '#' for all VFs)" $p $r $example) }}
{{- end }}
{{- range $part := splitList "," $tail }}
{{- $part = trim $part }}
{{- if not (regexMatch "^[0-9]+(-[0-9]+)?$" $part) }}
{{- fail (printf "%s: %s has a bad VF index or range %s (fix: write indexes and inclusive ranges like '%s')" $p $r (include "topo-device-plugin.repr" $part) $example) }}
{{- end }}
{{- $ends := splitList "-" $part }}
{{- if lt (atoi (last $ends)) (atoi (first $ends)) }}
{{- fail (printf "%s: %s has the range %s whose end is before its start (fix: write it as %d-%d)" $p $r (include "topo-device-plugin.repr" $part) (atoi (last $ends)) (atoi (first $ends))) }}
{{- end }}
{{- end }}
{{- end }}
{{- if hasKey $seen $pf }}
{{- fail (printf "%s: %s is already listed at %s[%v] (only the first would count) (fix: merge the VF ranges into one item, e.g. 'ens1f0#0-1,3')" $p (include "topo-device-plugin.repr" $head) $.path (get $seen $pf)) }}
{{- end }}
{{- $_ := set $seen $pf $i }}
{{- end }}
{{- end }}

{{- define "topo-device-plugin.validateMapping" -}}
{{- $ext := .Values.dra.extendedResources | default list }}
{{- $dra := .Values.dra.resources | default list }}
{{- $gpu := (include "topo-device-plugin.option" (dict "root" . "key" "gpuResourceName" "flag" "--gpu-resource-name" "default" "nvidia.com/gpu") | fromJson).value }}
{{- $draNics := without $dra $gpu }}
{{- range $name := $ext }}
{{- if not (has $name $dra) }}
{{- fail (printf "dra.extendedResources: '%s' is not served through DRA here (dra.resources: [%s]): the device plugin serves it and the node advertises it, and a node serves a name one way only (fix: add %s to dra.resources, or remove it from dra.extendedResources)" $name (join ", " $dra) $name) }}
{{- end }}
{{- if and (ne $name $gpu) (gt (len $draNics) 1) }}
{{- fail (printf "dra.extendedResources: '%s' cannot be mapped while %d NIC resources are served through DRA (%s): the DeviceClass nic.%s holds every NIC the driver publishes and would hand out the others under this name (fix: serve one NIC resource through DRA, or leave the NIC resources out of dra.extendedResources)" $name (len $draNics) (join ", " $draNics) (include "topo-device-plugin.draDriver" $)) }}
{{- end }}
{{- end }}
{{- if and $ext (not .Values.dra.deviceClasses) }}
{{- fail "dra.extendedResources: needs dra.deviceClasses true: the mapping is the extendedResourceName of the chart's DeviceClasses (fix: set dra.deviceClasses true, or leave dra.extendedResources empty and map the name in a DeviceClass of your own)" }}
{{- end }}
{{- end }}

{{- define "topo-device-plugin.validate" -}}
{{- include "topo-device-plugin.validateMapping" . }}
{{- if not .Values.config.existingConfigMap }}
{{- $sharing := .Values.config.sharing | default dict }}
{{- $pools := (.Values.config.nics | default dict).resourceList | default list }}
{{- $gpuOption := include "topo-device-plugin.option" (dict "root" . "key" "gpuResourceName" "flag" "--gpu-resource-name" "default" "nvidia.com/gpu") | fromJson }}
{{- $nicOption := include "topo-device-plugin.option" (dict "root" . "key" "nicResourceName" "flag" "--nic-resource-name" "default" "topo.dev/nic") | fromJson }}
{{- $gpu := $gpuOption.value }}
{{- $nic := $nicOption.value }}
{{- $mig := (include "topo-device-plugin.option" (dict "root" . "key" "migStrategy" "flag" "--mig-strategy" "default" "none") | fromJson).value }}

{{- /* sharing.mps beside sharing.timeSlicing */}}
{{- if and $sharing.mps $sharing.timeSlicing }}
{{- fail "config.sharing.mps: a config cannot share GPUs both by time-slicing and by MPS (fix: keep sharing.timeSlicing or sharing.mps, not both; see docs/sharing.md)" }}
{{- end }}

{{- /* NIC pools: names valid and unique */}}
{{- $names := list $gpu }}
{{- $seen := dict }}
{{- range $i, $p := $pools }}
{{- $full := printf "%s/%s" (ternary $p.resourcePrefix "topo.dev" (hasKey $p "resourcePrefix")) (toString $p.resourceName) }}
{{- with include "topo-device-plugin.resourceNameError" $full }}
{{- fail (printf "config.nics.resourceList[%d].resourceName: %s (fix: start and end the name with a letter or digit)" $i .) }}
{{- end }}
{{- $selectors := list }}
{{- if kindIs "map" $p.selectors }}
{{- $selectors = list (dict "path" (printf "nics.resourceList[%d].selectors" $i) "selector" $p.selectors) }}
{{- else }}
{{- range $j, $sel := $p.selectors }}
{{- $selectors = append $selectors (dict "path" (printf "nics.resourceList[%d].selectors[%d]" $i $j) "selector" $sel) }}
{{- end }}
{{- end }}
{{- range $selectors }}
{{- $sel := .selector }}
{{- $spath := .path }}
{{- range $key := list "pfNames" "rootDevices" }}
{{- with index $sel $key }}
{{- include "topo-device-plugin.checkVfRanges" (dict "path" (printf "%s.%s" $spath $key) "kind" $key "items" .) }}
{{- end }}
{{- end }}
{{- $drivers := list }}
{{- range $sel.drivers | default list }}{{ $drivers = append $drivers (trim .) }}{{ end }}
{{- if and (eq (toString $sel.isRdma) "true") (eq (join "," (uniq $drivers)) "vfio-pci") }}
{{- fail (printf "config.%s.isRdma: vfio-pci functions have no RDMA device, so nothing can match (fix: drop isRdma or select a kernel driver such as mlx5_core)" $spath) }}
{{- end }}
{{- end }}
{{- if hasKey $seen $full }}
{{- fail (printf "config.nics.resourceList[%d].resourceName: %s is already defined at nics.resourceList[%v] (fix: give every pool a unique resourceName (or a different resourcePrefix))" $i $full (get $seen $full)) }}
{{- end }}
{{- $_ := set $seen $full $i }}
{{- $names = append $names $full }}
{{- end }}
{{- if not $pools }}
{{- $names = append $names $nic }}
{{- end }}

{{- /* the GPU and default NIC resource names */}}
{{- with include "topo-device-plugin.resourceNameError" $gpu }}
{{- fail (printf "%s: %s" $gpuOption.where .) }}
{{- end }}
{{- with include "topo-device-plugin.resourceNameError" $nic }}
{{- fail (printf "%s: %s" $nicOption.where .) }}
{{- end }}

{{- /* DRA vs device-plugin split */}}
{{- $timeSlicing := $sharing.timeSlicing | default dict }}
{{- $shared := $timeSlicing.resources | default list }}
{{- range $name := .Values.dra.resources | default list }}
{{- if not (has $name $names) }}
{{- fail (printf "dra.resources: '%s' is not a resource of this configuration; it serves %s (fix: name one of these, or add a NIC pool called so under nics.resourceList)" $name (join ", " $names)) }}
{{- end }}
{{- end }}
{{- if has $gpu (.Values.dra.resources | default list) }}
{{- if ne $mig "none" }}
{{- fail (printf "dra.resources: %s through DRA needs MIG strategy none, not '%s': migStrategy is the device-plugin side's; through DRA, MIG devices are chosen by draMig (fix: set flags.migStrategy none and flags.draMig static or dynamic, or remove %s from draResources to keep MIG on the device-plugin side)" $gpu $mig $gpu) }}
{{- end }}
{{- if $shared }}
{{- fail (printf "dra.resources: %s through DRA cannot be time-sliced: a DRA device belongs to one claim at a time (fix: remove sharing.timeSlicing, or remove %s from draResources)" $gpu $gpu) }}
{{- end }}
{{- end }}

{{- $draMig := include "topo-device-plugin.option" (dict "root" . "key" "draMig" "flag" "--dra-mig" "default" "none") | fromJson }}
{{- if and (ne $draMig.value "none") (not (has $gpu (.Values.dra.resources | default list))) }}
{{- fail (printf "%s: MIG through DRA needs the GPU resource %s in draResources (fix: add it, or set draMig none)" $draMig.where $gpu) }}
{{- end }}

{{- /* time-slicing entries */}}
{{- $domain := splitList "/" $gpu | first }}
{{- $targets := dict }}
{{- range $i, $e := $shared }}
{{- $where := printf "config.sharing.timeSlicing.resources[%d]" $i }}
{{- $name := include "topo-device-plugin.qualify" (dict "name" (toString $e.name) "domain" $domain) }}
{{- if not (or (eq $name $gpu) (hasPrefix (printf "%s/mig-" $domain) $name)) }}
{{- fail (printf "%s.name: '%s' cannot be time-sliced: only %s and the MIG resources of --mig-strategy mixed (%s/mig-<profile>) can (fix: name one of them)" $where $name $gpu $domain) }}
{{- end }}
{{- $target := "" }}
{{- if $e.rename }}
{{- $target = include "topo-device-plugin.qualify" (dict "name" (toString $e.rename) "domain" $domain) }}
{{- else }}
{{- $target = printf "%s%s" $name (ternary ".shared" "" (eq (toString $timeSlicing.renameByDefault) "true")) }}
{{- end }}
{{- with include "topo-device-plugin.resourceNameError" $target }}
{{- fail (printf "%s.rename: %s" $where .) }}
{{- end }}
{{- if and (hasKey $targets $target) (ne (get $targets $target) $name) }}
{{- fail (printf "%s: %s already holds replicas of %s (fix: give the replicas of each resource their own name)" $where $target (get $targets $target)) }}
{{- end }}
{{- if not (hasKey $targets $target) }}
{{- $_ := set $targets $target $name }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
