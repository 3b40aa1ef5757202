{{- define "convgate.fullname" -}}
{{- printf "%s" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "convgate.labels" -}}
app.kubernetes.io/name: convgate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "convgate.image" -}}
{{ printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end -}}

{{- define "convgate.workerImage" -}}
{{- $image := .Values.worker.image | default dict -}}
{{ printf "%s:%s" (default .Values.image.repository $image.repository) (default (default .Chart.AppVersion .Values.image.tag) $image.tag) }}
{{- end -}}

{{- define "convgate.databaseSecret" -}}
{{- if .Values.database.existingSecret -}}{{ .Values.database.existingSecret }}{{- else -}}{{ include "convgate.fullname" . }}-database{{- end -}}
{{- end -}}

{{- define "convgate.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "convgate.podSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "convgate.databaseEnv" -}}
- name: CONVGATE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "convgate.databaseSecret" . }}
      key: {{ .Values.database.key }}
{{- end -}}

{{- /* Egress every convgate pod needs: DNS (kube-system) and the database (its CIDR, else any address on its port). */}}
{{- define "convgate.egressDnsAndDatabase" -}}
- to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: kube-system
  ports:
    - {protocol: UDP, port: 53}
    - {protocol: TCP, port: 53}
- ports:
    - {protocol: TCP, port: {{ .Values.networkPolicy.databasePort }}}
  {{- with .Values.networkPolicy.databaseCIDR }}
  to:
    - ipBlock:
        cidr: {{ . }}
  {{- end }}
{{- end -}}

{{- /* Everything but the workers' own objects: the API, its RBAC, its config and hooks. Empty (false) in
       the `worker` topology, where this chart only prepares a MultiKueue worker cluster's namespace. */}}
{{- define "convgate.controlPlane" -}}
{{- if ne .Values.topology "worker" }}true{{- end -}}
{{- end -}}
