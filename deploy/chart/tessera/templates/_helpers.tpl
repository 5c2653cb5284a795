{{/* The image of a component: <registry>/<name>:<tag>, the tag defaulting to the chart's appVersion. */}}
{{- define "tessera.image" -}}
{{- $root := index . 0 -}}{{- $name := index . 1 -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $root.Values.image.registry) $name (default $root.Chart.AppVersion $root.Values.image.tag) -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "tessera.labels" -}}
{{- $root := index . 0 -}}{{- $name := index . 1 -}}
app.kubernetes.io/name: {{ $name }}
app.kubernetes.io/part-of: tessera
app.kubernetes.io/version: {{ default $root.Chart.AppVersion $root.Values.image.tag | quote }}
{{- end -}}

{{/* A service account's user name, as the admission policies match it. */}}
{{- define "tessera.user" -}}
{{- printf "system:serviceaccount:%s:%s" (index . 0).Release.Namespace (index . 1) -}}
{{- end -}}

{{/*
The agent's TesseraConfiguration (ConfigMap tessera-agent-config): what it
shares with TesseraGPU's arguments, from the same values.
*/}}
{{- define "tessera.agentConfig" -}}
apiVersion: tessera.dev/v1alpha1
kind: TesseraConfiguration
allocator:
  memoryOversubscription: {{ .Values.scheduler.memoryOversubscription }}
  minSliceMiB:
    training: {{ .Values.scheduler.minSliceMiB.training }}
    inference: {{ .Values.scheduler.minSliceMiB.inference }}
{{- end }}
