{{/*
Names. The name part of object names is nameOverride or the chart's name; objects are named
<release>-<name> (or the release's name alone when it already contains the name, so release
"ipvs-leftovers" gives the kustomize base's names), or fullnameOverride. Two releases therefore
never share an object. The label app.kubernetes.io/name stays "ipvs-leftovers" whatever
nameOverride says: it is the Prometheus job (the PodMonitor's jobLabel) that every alert selects
exactly, job="ipvs-leftovers".
*/}}
{{- define "ipvs-leftovers.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ipvs-leftovers.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "ipvs-leftovers.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ipvs-leftovers.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* What selects one release's agent pods (the DaemonSet, the PodMonitor, the helm test). */}}
{{- define "ipvs-leftovers.selectorLabels" -}}
app.kubernetes.io/name: ipvs-leftovers
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}

{{/* The recommended labels, on every object. */}}
{{- define "ipvs-leftovers.labels" -}}
helm.sh/chart: {{ include "ipvs-leftovers.chart" . }}
app.kubernetes.io/name: ipvs-leftovers
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ipvs-leftovers
{{- end }}

{{- define "ipvs-leftovers.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ipvs-leftovers.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: the ServiceAccount to use when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* registry/repository, then @digest when set, else :tag (default: the agent's version). */}}
{{- define "ipvs-leftovers.image" -}}
{{- $repo := .Values.image.repository }}
{{- if .Values.image.registry }}{{ $repo = printf "%s/%s" .Values.image.registry .Values.image.repository }}{{ end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{- define "ipvs-leftovers.scheme" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/*
"true" when the PodMonitor / PrometheusRule is rendered: enabled true always, false never,
"auto" when the API server serves monitoring.coreos.com/v1's kind (the Prometheus Operator's
CRDs are installed; `helm template` without --api-versions knows of none).
*/}}
{{- define "ipvs-leftovers.crdEnabled" -}}
{{- $v := index . 0 }}{{ $ctx := index . 1 }}{{ $kind := index . 2 }}
{{- if eq (toString $v) "auto" }}
{{- if $ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind) }}true{{ end }}
{{- else if $v }}true{{ end }}
{{- end }}

{{/* Where each alert's runbook_url points: rules.runbookBaseURL, else this version's docs. */}}
{{- define "ipvs-leftovers.runbookBase" -}}
{{- if .Values.rules.runbookBaseURL }}
{{- trimSuffix "/" .Values.rules.runbookBaseURL }}
{{- else }}
{{- printf "%s/blob/v%s/docs/runbooks" .Chart.Home .Chart.AppVersion }}
{{- end }}
{{- end }}

{{/* The fleet step's objects (CronJob, ServiceAccount, Role, ClusterRole, bindings) and its
Lease: <fullname>-fleet, so the default release's Lease is the command's default. */}}
{{- define "ipvs-leftovers.fleet.name" -}}
{{- printf "%s-fleet" (include "ipvs-leftovers.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "ipvs-leftovers.fleet.serviceAccountName" -}}
{{- if .Values.fleet.serviceAccount.create }}
{{- default (include "ipvs-leftovers.fleet.name" .) .Values.fleet.serviceAccount.name }}
{{- else }}
{{- required "fleet.serviceAccount.name: the ServiceAccount to use when fleet.serviceAccount.create is false" .Values.fleet.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image build's fleet variant (the Kubernetes client: `fleet step`): the agent's
registry/repository, tag TAG-fleet (TAG: fleet.image.tag, else image.tag, else the agent's
version), or fleet.image.digest (the variant's own digest, never the agent's). */}}
{{- define "ipvs-leftovers.fleet.image" -}}
{{- $repo := .Values.image.repository }}
{{- if .Values.image.registry }}{{ $repo = printf "%s/%s" .Values.image.registry .Values.image.repository }}{{ end }}
{{- if .Values.fleet.image.digest }}
{{- printf "%s@%s" $repo .Values.fleet.image.digest }}
{{- else }}
{{- printf "%s:%s-fleet" $repo (.Values.fleet.image.tag | default .Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}
