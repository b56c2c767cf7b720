{{/* The label every object carries (kustomize's `labels:` in the base). */}}
{{- define "ipvs-leftovers.partOf" -}}
app.kubernetes.io/part-of: ipvs-leftovers
{{- end -}}
