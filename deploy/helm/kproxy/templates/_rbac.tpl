{{/*
The service account's rules, computed from the rendered config (docs/security.md):

- each `watchcache` filter: get, list and watch on its `resources` (the cache lists and watches
  them with kproxy's own credentials). An entry is "pods", "deployments.apps" (resource.group,
  as kubectl spells it) or {group: apps, resource: deployments}.
- credentials forward or impersonate: create on tokenreviews (who is the caller) and
  subjectaccessreviews (may the caller see what the cache would serve).
- credentials impersonate: impersonate on users, groups, serviceaccounts and userextras/*
  (and uids): kproxy acts as each caller.
- a `validation` filter: get on /openapi/v2 and /openapi/v3/* (the schemas it validates with).
- the dry-run, compression and transcode filters need nothing of their own.
- rbac.extraRules, verbatim (in proxy mode: whatever every caller may do).
*/}}
{{- define "kproxy.rbacRules" -}}
{{- $cfg := include "kproxy.config" . | fromYaml -}}
{{- $creds := $cfg.credentials | default "proxy" -}}
{{- $rules := list -}}
{{- $byGroup := dict -}}
{{- range $i, $f := ($cfg.filters | default list) -}}
{{- if eq $f.name "watchcache" -}}
{{- range $r := ($f.resources | default list) -}}
{{- $group := "" -}}{{- $resource := "" -}}
{{- if kindIs "string" $r -}}
{{- $parts := splitn "." 2 $r -}}
{{- $resource = $parts._0 -}}{{- $group = $parts._1 | default "" -}}
{{- else -}}
{{- $resource = $r.resource -}}{{- $group = $r.group | default "" -}}
{{- end -}}
{{- $_ := set $byGroup $group (append (get $byGroup $group | default list) $resource | uniq) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $group := keys $byGroup | sortAlpha -}}
{{- $rules = append $rules (dict "apiGroups" (list $group) "resources" (get $byGroup $group | sortAlpha) "verbs" (list "get" "list" "watch")) -}}
{{- end -}}
{{- if or (eq $creds "forward") (eq $creds "impersonate") -}}
{{- $rules = append $rules (dict "apiGroups" (list "authentication.k8s.io") "resources" (list "tokenreviews") "verbs" (list "create")) -}}
{{- $rules = append $rules (dict "apiGroups" (list "authorization.k8s.io") "resources" (list "subjectaccessreviews") "verbs" (list "create")) -}}
{{- end -}}
{{- if eq $creds "impersonate" -}}
{{- $rules = append $rules (dict "apiGroups" (list "") "resources" (list "users" "groups" "serviceaccounts") "verbs" (list "impersonate")) -}}
{{- $rules = append $rules (dict "apiGroups" (list "authentication.k8s.io") "resources" (list "userextras/*" "uids") "verbs" (list "impersonate")) -}}
{{- end -}}
{{- range $i, $f := ($cfg.filters | default list) -}}
{{- if eq $f.name "validation" -}}
{{- $rules = append $rules (dict "nonResourceURLs" (list "/openapi/v2" "/openapi/v3" "/openapi/v3/*") "verbs" (list "get")) -}}
{{- end -}}
{{- end -}}
{{- range $r := .Values.rbac.extraRules -}}
{{- $rules = append $rules $r -}}
{{- end -}}
{{- toYaml $rules -}}
{{- end }}
