{{/*
Names are fixed, as `service-mirror install` prints them (one release per namespace):
the ServiceAccount, Role, RoleBinding, Deployment and PodDisruptionBudget are
`service-mirror`, the ClusterRole and ClusterRoleBinding
`service-mirror-controller:<namespace>` (one pair per installation), the admin Service
`service-mirror-admin`.
*/}}
{{- define "service-mirror.name" -}}service-mirror{{- end }}

{{- define "service-mirror.clusterRoleName" -}}
service-mirror-controller:{{ .Release.Namespace }}
{{- end }}

{{/* The labels of install's objects: they select the pods. */}}
{{- define "service-mirror.selectorLabels" -}}
app.kubernetes.io/name: service-mirror
app.kubernetes.io/component: controller
{{- end }}

{{/*
Every object's labels: install's, with Helm's own (managed-by Helm, not
service-mirror; the release, chart and app version), which the comparison with
`install` leaves out.
*/}}
{{- define "service-mirror.labels" -}}
{{ include "service-mirror.selectorLabels" . }}
{{ include "service-mirror.helmLabels" . }}
{{- end }}

{{/* Helm's own labels alone: on the Links and their Secrets (`link --format link`
prints none). */}}
{{- define "service-mirror.helmLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "service-mirror.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
A CRD from files/crds (byte for byte the controller's embedded YAML, checked by
tests/cli_links.rs) with the chart's labels and `helm.sh/resource-policy: keep`.
*/}}
{{- define "service-mirror.crd" -}}
{{- $crd := .root.Files.Get (printf "files/crds/%s" .file) | fromYaml }}
{{- $labels := merge (include "service-mirror.labels" .root | fromYaml) ($crd.metadata.labels | default dict) }}
{{- $annotations := merge (dict "helm.sh/resource-policy" "keep") ($crd.metadata.annotations | default dict) }}
{{- $_ := set $crd.metadata "labels" $labels }}
{{- $_ := set $crd.metadata "annotations" $annotations }}
---
{{ toYaml $crd }}
{{- end }}

{{/* `run`'s arguments, from .Values.controller: nothing for an empty value. */}}
{{- define "service-mirror.args" -}}
{{- $c := .Values.controller -}}
- run
- --namespace
- {{ .Release.Namespace | quote }}
{{- with $c.logFormat }}
- --log-format
- {{ . | quote }}
{{- end }}
{{- with $c.logLevel }}
- {{ printf "--log-level=%v" (.) | quote }}
{{- end }}
{{- with $c.endpointsMode }}
- {{ printf "--endpoints-mode=%v" (.) | quote }}
{{- end }}
{{- with $c.namespaceAllow }}
- {{ printf "--namespace-allow=%v" (join "," .) | quote }}
{{- end }}
{{- if kindIs "slice" $c.namespaceDeny }}
- {{ printf "--namespace-deny=%v" (join "," $c.namespaceDeny) | quote }}
{{- end }}
{{- with $c.gatewayAddressDeny }}
- {{ printf "--gateway-address-deny=%v" (join "," .) | quote }}
{{- end }}
{{- with $c.gatewayAddressAllow }}
- {{ printf "--gateway-address-allow=%v" (join "," .) | quote }}
{{- end }}
{{- if $c.enableHeadlessServices }}
- --enable-headless-services
{{- end }}
{{- if $c.headlessHostnameFromTargetRef }}
- --headless-hostname-from-target-ref
{{- end }}
{{- with $c.mcs }}
- {{ printf "--mcs=%v" (.) | quote }}
{{- end }}
{{- with $c.mcsClusterName }}
- {{ printf "--mcs-cluster-name=%v" (.) | quote }}
{{- end }}
{{- with $c.staleAfter }}
- {{ printf "--stale-after=%v" (.) | quote }}
{{- end }}
{{- with $c.staleDeleteAfter }}
- {{ printf "--stale-delete-after=%v" (.) | quote }}
{{- end }}
{{- with $c.remoteGrace }}
- {{ printf "--remote-grace=%v" (.) | quote }}
{{- end }}
{{- with $c.leaseDuration }}
- {{ printf "--lease-duration=%v" (.) | quote }}
{{- end }}
{{- with $c.linkSource }}
- {{ printf "--link-source=%v" (.) | quote }}
{{- end }}
{{- if kindIs "bool" $c.enableNamespaceCreation }}
- {{ printf "--enable-namespace-creation=%v" ($c.enableNamespaceCreation) | quote }}
{{- end }}
{{- if kindIs "bool" $c.collectUnlinkedMirrors }}
- {{ printf "--collect-unlinked-mirrors=%v" ($c.collectUnlinkedMirrors) | quote }}
{{- end }}
{{- if kindIs "bool" $c.shardLinks }}
- {{ printf "--shard-links=%v" ($c.shardLinks) | quote }}
{{- end }}
{{- with $c.shardStandby }}
- {{ printf "--shard-standby=%v" (.) | quote }}
{{- end }}
{{- if not (kindIs "invalid" $c.maxMirrorsPerLink) }}
- {{ printf "--max-mirrors-per-link=%v" (int64 $c.maxMirrorsPerLink) | quote }}
{{- end }}
{{- if .Values.clustersetDns.enabled }}
{{- if eq (toString $c.mcs) "off" }}
{{- fail "clustersetDns.enabled needs MCS: the zone is served from the MCS component's ServiceImports, which controller.mcs=off turns off (run refuses --clusterset-dns-addr with --mcs=off); set controller.mcs to auto or on, or clustersetDns.enabled=false" }}
{{- end }}
- "--clusterset-dns-addr=:5353"
{{- end }}
{{- range $c.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}
