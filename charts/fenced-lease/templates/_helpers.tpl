{{/* Name of the chart, or nameOverride. */}}
{{- define "fenced-lease.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object: the release name, unless it already contains the chart name. */}}
{{- define "fenced-lease.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Labels of every object: the chart's own and commonLabels, where the chart's own win
(app.kubernetes.io/component is the templates' to set).
*/}}
{{- define "fenced-lease.labels" -}}
{{- $own := dict
  "helm.sh/chart" (printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-")
  "app.kubernetes.io/name" (include "fenced-lease.name" .)
  "app.kubernetes.io/instance" .Release.Name
  "app.kubernetes.io/version" .Chart.AppVersion
  "app.kubernetes.io/managed-by" .Release.Service
  "app.kubernetes.io/part-of" "fenced-lease" }}
{{- toYaml (merge $own (omit (.Values.commonLabels | default dict) "app.kubernetes.io/component")) }}
{{- end }}

{{/* Selector of the operator's pods. */}}
{{- define "fenced-lease.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fenced-lease.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "fenced-lease.operatorName" -}}
{{ include "fenced-lease.fullname" . }}-operator
{{- end }}

{{- define "fenced-lease.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fenced-lease.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* registry/repository:tag, or registry/repository@digest; no registry: repository alone. */}}
{{- define "fenced-lease.image" -}}
{{- $name := .Values.image.repository }}
{{- with .Values.image.registry }}{{ $name = printf "%s/%s" (trimSuffix "/" .) $name }}{{ end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $name .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $name (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The documents of a multi-document YAML file of the chart (files/...), parsed; comment-only
documents are skipped.
*/}}
{{- define "fenced-lease.documents" -}}
{{- $docs := list }}
{{- range regexSplit "(?m)^---[ \t]*$" (.Files.Get .path) -1 }}
{{- $doc := fromYaml . }}
{{- if $doc.Error }}{{ fail (printf "%s: %s" $.path $doc.Error) }}{{ end }}
{{- if $doc }}{{ $docs = append $docs $doc }}{{ end }}
{{- end }}
{{- toJson $docs }}
{{- end }}

{{/*
The name of an object of deploy/ (fenced-lease-operator, fenced-lease-holder, ...) in this
release: the prefix fenced-lease becomes the release's fullname.
*/}}
{{- define "fenced-lease.renamed" -}}
{{- regexReplaceAll "^fenced-lease" .name (include "fenced-lease.fullname" .root) }}
{{- end }}
