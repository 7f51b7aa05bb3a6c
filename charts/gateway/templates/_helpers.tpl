{{- define "gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gateway.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gateway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: svc-gateway
{{- end -}}

{{/* Selector labels of one component: gateway, operator, redis, postgres, migrate. */}}
{{- define "gateway.selector" -}}
app.kubernetes.io/name: {{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "gateway.image" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "gateway.podSecurityContext" -}}
{{- with .Values.podSecurityContext }}
{{- toYaml . }}
{{- else -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end -}}

{{- define "gateway.containerSecurityContext" -}}
{{- with .Values.containerSecurityContext }}
{{- toYaml . }}
{{- else -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end }}
{{- end -}}

{{- define "gateway.storesSecret" -}}
{{- printf "%s-stores" (include "gateway.fullname" .) -}}
{{- end -}}

{{/* Whether the chart writes a store's URL into its own Secret: an in-cluster store, or a URL
given in values; otherwise the URL is in an existing Secret. */}}
{{- define "gateway.redisOwned" -}}
{{- if or .Values.redis.inCluster.enabled .Values.redis.url -}}true{{- end -}}
{{- end -}}

{{- define "gateway.postgresOwned" -}}
{{- if or .Values.postgres.inCluster.enabled .Values.postgres.url -}}true{{- end -}}
{{- end -}}

{{- define "gateway.redisSecretRef" -}}
{{- if include "gateway.redisOwned" . -}}
name: {{ include "gateway.storesSecret" . }}
key: redis-url
{{- else -}}
name: {{ required "redis: set existingSecret, url or inCluster.enabled" .Values.redis.existingSecret }}
key: {{ .Values.redis.existingSecretKey }}
{{- end -}}
{{- end -}}

{{- define "gateway.postgresSecretRef" -}}
{{- if include "gateway.postgresOwned" . -}}
name: {{ include "gateway.storesSecret" . }}
key: database-url
{{- else -}}
name: {{ .Values.postgres.existingSecret }}
key: {{ .Values.postgres.existingSecretKey }}
{{- end -}}
{{- end -}}

{{/* Postgres is optional until the ledger needs it: on when any source is given. */}}
{{- define "gateway.hasPostgres" -}}
{{- if or (include "gateway.postgresOwned" .) .Values.postgres.existingSecret -}}true{{- end -}}
{{- end -}}

{{- define "gateway.adminTokenSecret" -}}
{{- default (printf "%s-admin" (include "gateway.fullname" .)) .Values.gateway.adminTokenSecret -}}
{{- end -}}

{{- define "gateway.responsesSecret" -}}
{{- default (printf "%s-responses" (include "gateway.fullname" .)) .Values.gateway.responsesSecret -}}
{{- end -}}

{{- define "gateway.databaseEnv" -}}
{{- if include "gateway.hasPostgres" . }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      {{- include "gateway.postgresSecretRef" . | nindent 6 }}
{{- end }}
{{- end -}}

{{/* The stores' URLs, as every gateway container gets them: the database through its pooler
when there is one (migrations keep the direct URL: PgBouncer's transaction pooling cannot run
them). */}}
{{- define "gateway.storeEnv" -}}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      {{- include "gateway.redisSecretRef" . | nindent 6 }}
{{- if and .Values.postgres.poolerSecret (include "gateway.hasPostgres" .) }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.postgres.poolerSecret }}
      key: {{ .Values.postgres.poolerSecretKey }}
- name: GATEWAY_DATABASE_POOLER
  value: transaction
{{- else }}
{{- include "gateway.databaseEnv" . }}
{{- end }}
{{- end -}}

{{- define "gateway.migrateContainer" -}}
name: migrate
image: {{ include "gateway.image" (dict "image" .Values.gateway.image "root" .) }}
imagePullPolicy: {{ .Values.gateway.image.pullPolicy }}
args: ["migrate"]
env:
  {{- include "gateway.databaseEnv" . | indent 2 }}
  {{- include "gateway.storeTlsEnv" (dict "root" . "redis" false) | indent 2 }}
{{- with include "gateway.storeTlsMounts" (dict "root" . "redis" false) }}
volumeMounts:
  {{- . | trim | nindent 2 }}
{{- end }}
securityContext:
  {{- include "gateway.containerSecurityContext" . | nindent 2 }}
resources:
  {{- toYaml .Values.gateway.resources | nindent 2 }}
{{- end -}}

{{/* Whether the operator owns the gateway Deployment's replicas. Then the chart leaves
spec.replicas out, so `helm upgrade` never resets what the scaler (or `kubectl scale`) set:
Helm's three-way merge only patches fields the chart renders. */}}
{{- define "gateway.operatorScales" -}}
{{- if and .Values.operator.enabled .Values.operator.scaleGateway -}}true{{- end -}}
{{- end -}}

{{/* Names of the operator's Secret and Lease: derived from the release unless set, so two
releases in one namespace do not share them. */}}
{{- define "gateway.configSecret" -}}
{{- default (printf "%s-config" (include "gateway.fullname" .)) .Values.operator.configSecret -}}
{{- end -}}

{{- define "gateway.lease" -}}
{{- default (printf "%s-operator" (include "gateway.fullname" .)) .Values.operator.lease -}}
{{- end -}}

{{/* TLS to the stores: the CA bundles and client certificates of postgres.tls and redis.tls,
mounted read-only under /etc/gateway/tls and named to the processes by their flags'
environment variables. Each takes (dict "root" $ "redis" BOOL): the gateway pods connect to
both stores, the migrations and the operator to Postgres alone. */}}
{{- define "gateway.storeTlsEnv" -}}
{{- $pg := .root.Values.postgres.tls -}}
{{- $redis := .root.Values.redis.tls -}}
{{- if include "gateway.hasPostgres" .root }}
{{- if $pg.caSecret }}
- name: GATEWAY_DATABASE_CA_FILE
  value: /etc/gateway/tls/postgres/ca.crt
{{- end }}
{{- if $pg.clientCertSecret }}
- name: GATEWAY_DATABASE_CLIENT_CERT_FILE
  value: /etc/gateway/tls/postgres-client/tls.crt
- name: GATEWAY_DATABASE_CLIENT_KEY_FILE
  value: /etc/gateway/tls/postgres-client/tls.key
{{- end }}
{{- end }}
{{- if .redis }}
{{- if $redis.caSecret }}
- name: GATEWAY_REDIS_CA_FILE
  value: /etc/gateway/tls/redis/ca.crt
{{- end }}
{{- if $redis.clientCertSecret }}
- name: GATEWAY_REDIS_CLIENT_CERT_FILE
  value: /etc/gateway/tls/redis-client/tls.crt
- name: GATEWAY_REDIS_CLIENT_KEY_FILE
  value: /etc/gateway/tls/redis-client/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{- define "gateway.storeTlsMounts" -}}
{{- range (include "gateway.storeTlsNames" . | fromJsonArray) }}
- name: {{ . }}
  mountPath: /etc/gateway/tls/{{ trimSuffix "-ca" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "gateway.storeTlsVolumes" -}}
{{- $values := .root.Values -}}
{{- range (include "gateway.storeTlsNames" . | fromJsonArray) }}
- name: {{ . }}
  secret:
    {{- if hasSuffix "-client" . }}
    secretName: {{ (get $values (trimSuffix "-client" .)).tls.clientCertSecret }}
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
    {{- else }}
    {{- $tls := (get $values (trimSuffix "-ca" .)).tls }}
    secretName: {{ $tls.caSecret }}
    items:
      - key: {{ $tls.caSecretKey }}
        path: ca.crt
    {{- end }}
{{- end }}
{{- end -}}

{{/* The volumes of TLS to the stores a container mounts, as a JSON list of names:
postgres-ca, postgres-client, redis-ca, redis-client. */}}
{{- define "gateway.storeTlsNames" -}}
{{- $names := list -}}
{{- if include "gateway.hasPostgres" .root -}}
{{- if .root.Values.postgres.tls.caSecret }}{{ $names = append $names "postgres-ca" }}{{ end -}}
{{- if .root.Values.postgres.tls.clientCertSecret }}{{ $names = append $names "postgres-client" }}{{ end -}}
{{- end -}}
{{- if .redis -}}
{{- if .root.Values.redis.tls.caSecret }}{{ $names = append $names "redis-ca" }}{{ end -}}
{{- if .root.Values.redis.tls.clientCertSecret }}{{ $names = append $names "redis-client" }}{{ end -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}
