{{/*
The sidecar story: another chart lists this one as a dependency (mode: sidecar), which renders
the ConfigMap, ServiceAccount and RBAC, and adds the container and its volumes to its own pod:

  spec:
    serviceAccountName: {{ include "kproxy.serviceAccountName" .Subcharts.kproxy }}
    automountServiceAccountToken: false      # only the kproxy container gets the token
    containers:
      - name: app ...                        # talks to http://127.0.0.1:<ports.proxy>
      {{- include "kproxy.sidecar.container" .Subcharts.kproxy | nindent 6 }}
    volumes:
      {{- include "kproxy.sidecar.volumes" .Subcharts.kproxy | nindent 6 }}
  and in the pod template's annotations:
      checksum/kproxy-config: {{ include "kproxy.configChecksum" .Subcharts.kproxy }}

`.Subcharts.kproxy` is this chart's own context (its values, name and appVersion) as the parent
sees it. Complete example: deploy/helm/examples/app-with-sidecar.
*/}}
{{- define "kproxy.sidecar.container" -}}
{{- if ne .Values.mode "sidecar" -}}
{{- fail "kproxy.sidecar.container: set kproxy.mode: sidecar in the parent chart's values" -}}
{{- end -}}
{{- include "kproxy.container" . -}}
{{- end }}

{{- define "kproxy.sidecar.volumes" -}}
{{- include "kproxy.volumes" . -}}
{{- end }}
