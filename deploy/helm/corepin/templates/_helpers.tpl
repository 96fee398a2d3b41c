{{/* Shared pieces of corepin's templates. */}}

{{/* Labels of every object: the kustomize tree's part-of, plus Helm's own. */}}
{{- define "corepin.labels" -}}
app.kubernetes.io/part-of: corepin
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Labels of a component's objects (and its selector): name corepin, the component. */}}
{{- define "corepin.componentLabels" -}}
app.kubernetes.io/name: corepin
app.kubernetes.io/component: {{ . }}
{{- end -}}

{{/* The image every component runs. */}}
{{- define "corepin.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The ServiceAccount name of a component in the release namespace, as a username. */}}
{{- define "corepin.agentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:corepin-agent
{{- end -}}

{{/*
Scheduling of a component's pods: its own nodeSelector and tolerations, else the chart's.
Called with (list $ .Values.<component>).
*/}}
{{- define "corepin.placement" -}}
{{- $root := index . 0 -}}
{{- $c := index . 1 -}}
{{- with ($c.nodeSelector | default $root.Values.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($c.tolerations | default $root.Values.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The policy flags of the agent and the NRI plugin. */}}
{{- define "corepin.policyArgs" -}}
- --policy={{ .Values.policy }}
{{- range $name, $value := .Values.policyOptions }}
{{- if eq (toString $value) "true" }}
- --option={{ $name }}
{{- else }}
- --option={{ $name }}={{ $value }}
{{- end }}
{{- end }}
{{- with .Values.reservedCPUs }}
- --reserved-cpus={{ . }}
{{- end }}
{{- end -}}

{{/* The container security context of the non-root components. */}}
{{- define "corepin.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* The pod security context of the non-root components. */}}
{{- define "corepin.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The probes of a component serving /healthz on the named port (scheme HTTP or HTTPS). */}}
{{- define "corepin.httpProbes" -}}
{{- $port := index . 0 -}}
{{- $scheme := index . 1 -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ $port }}
    {{- if eq $scheme "HTTPS" }}
    scheme: HTTPS
    {{- end }}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /healthz
    port: {{ $port }}
    {{- if eq $scheme "HTTPS" }}
    scheme: HTTPS
    {{- end }}
  periodSeconds: 5
  timeoutSeconds: 3
{{- end -}}

{{/* Refuse values that cannot work, naming the value. */}}
{{- define "corepin.validate" -}}
{{- if not (has .Values.mode (list "agent" "nri")) }}
{{- fail (printf "mode: %q is neither agent nor nri" .Values.mode) }}
{{- end }}
{{- if not (has .Values.agent.rebalance (list "" "off" "report" "move")) }}
{{- fail (printf "agent.rebalance: %q is not one of off, report, move" .Values.agent.rebalance) }}
{{- end }}
{{- if not (has .Values.webhook.tls.mode (list "secret" "certManager" "generate")) }}
{{- fail (printf "webhook.tls.mode: %q is not one of secret, certManager, generate" .Values.webhook.tls.mode) }}
{{- end }}
{{- if not (has .Values.webhook.failurePolicy (list "Ignore" "Fail")) }}
{{- fail (printf "webhook.failurePolicy: %q is neither Ignore nor Fail" .Values.webhook.failurePolicy) }}
{{- end }}
{{- if and .Values.networkPolicies.enabled (not .Values.networkPolicies.controlPlaneCIDRs) }}
{{- fail "networkPolicies.controlPlaneCIDRs: the control plane's addresses are needed when networkPolicies.enabled" }}
{{- end }}
{{- end -}}
