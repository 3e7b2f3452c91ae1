{{/*
The sidecar story: another chart lists this one as a dependency (mode: sidecar), which renders
the ConfigMap, ServiceAccount and RBAC, and adds the container and its volumes to its own pod:

  spec:
    serviceAccountName: {{ include "kproxy.serviceAccountName" .Subcharts.kproxy }}
    automountServiceAccountToken: false      # only the kproxy container gets the token
    {{- with include "kproxy.sidecar.initContainer" .Subcharts.kproxy }}
    initContainers:
      {{- . | nindent 6 }}
    {{- end }}
    containers:
      - name: app ...                        # talks to http://127.0.0.1:<ports.proxy>
      {{- include "kproxy.sidecar.container" .Subcharts.kproxy | nindent 6 }}
    volumes:
      {{- include "kproxy.sidecar.volumes" .Subcharts.kproxy | nindent 6 }}
  and in the pod template's annotations:
      checksum/kproxy-config: {{ include "kproxy.configChecksum" .Subcharts.kproxy }}

Exactly one of kproxy.sidecar.initContainer and kproxy.sidecar.container renders the kproxy
container, as sidecar.native says:

- native (an init container with restartPolicy: Always, Kubernetes >= 1.29; `auto` asks
  .Capabilities.KubeVersion): the kubelet starts the app only after kproxy's startup probe
  (/readyz) passed, a Job's pod completes when its app exits (the sidecar does not hold it), and
  on deletion kproxy is stopped after the app, so the app's last requests still reach it.
- classic (a second container): both start together (the app must retry until kproxy is ready),
  and a Job never completes while kproxy runs.

`.Subcharts.kproxy` is this chart's own context (its values, name, appVersion and the cluster's
capabilities) as the parent sees it. Complete example: deploy/helm/examples/app-with-sidecar.
*/}}
{{- define "kproxy.sidecar.check" -}}
{{- if ne .Values.mode "sidecar" -}}
{{- fail "kproxy.sidecar.*: set kproxy.mode: sidecar in the parent chart's values" -}}
{{- end -}}
{{- end }}

{{- define "kproxy.sidecar.container" -}}
{{- include "kproxy.sidecar.check" . -}}
{{- if not (include "kproxy.nativeSidecar" .) -}}
{{- include "kproxy.container" . -}}
{{- end -}}
{{- end }}

{{- define "kproxy.sidecar.initContainer" -}}
{{- include "kproxy.sidecar.check" . -}}
{{- if include "kproxy.nativeSidecar" . -}}
{{- include "kproxy.container" . }}
  restartPolicy: Always
{{- end -}}
{{- end }}

{{- define "kproxy.sidecar.volumes" -}}
{{- include "kproxy.volumes" . -}}
{{- end }}
