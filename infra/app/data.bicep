// The app's state: Azure SQL (the source of truth) with Microsoft Entra ID
// authentication only and the deployer (a user, or a pipeline's service
// principal) as its admin, who runs `migrate` (infra/hooks/postprovision.sh),
// and Azure Managed Redis (the guard) with access keys off, the identity
// and the operator signing in with Entra ID through access policy
// assignments.
param resourceToken string
param location string
param tags object
param identityPrincipalId string
@description('The Entra admin of the SQL server, and the operator on Redis.')
param adminObjectId string
param adminLogin string
@description('What the admin is: a user, or a service principal (a pipeline).')
@allowed([
  'User'
  'ServicePrincipal'
])
param adminPrincipalType string
@description('The database\'s service objective (Standard tier, DTU model).')
@allowed([
  'S0'
  'S1'
  'S2'
  'S3'
])
param sqlServiceObjective string
@description('The Log Analytics workspace the audit records go to.')
param workspaceId string

resource sql 'Microsoft.Sql/servers@2023-08-01' = {
  //checkov:skip=CKV_AZURE_113: the app has no virtual network; the firewall admits Azure's services and the deploying machine, and only Entra ID sign-ins are accepted
  name: 'sql-${resourceToken}'
  location: location
  tags: tags
  properties: {
    minimalTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
    administrators: {
      administratorType: 'ActiveDirectory'
      azureADOnlyAuthentication: true
      login: adminLogin
      // An application's SID in Azure SQL is its application (client) id,
      // which the preprovision hook gives as a service principal's login
      // name; a user's is the object id.
      sid: adminPrincipalType == 'User' ? adminObjectId : adminLogin
      // Azure SQL names a service principal's admin an Application.
      principalType: adminPrincipalType == 'User' ? 'User' : 'Application'
      tenantId: tenant().tenantId
    }
  }

  // Azure's own services (the Functions app) reach the server; the
  // deploying machine's address is added by the postprovision hook.
  resource azureServices 'firewallRules' = {
    name: 'AllowAllWindowsAzureIps'
    properties: {
      startIpAddress: '0.0.0.0'
      endIpAddress: '0.0.0.0'
    }
  }
}

// Server-level audit and threat detection, for every database; audit
// records reach the workspace through a database's diagnostic setting, whose
// retention applies there (retentionDays is a storage target's).
resource auditing 'Microsoft.Sql/servers/auditingSettings@2023-08-01' = {
  parent: sql
  name: 'default'
  properties: {
    state: 'Enabled'
    isAzureMonitorTargetEnabled: true
    retentionDays: 91
  }
}

resource alerts 'Microsoft.Sql/servers/securityAlertPolicies@2023-08-01' = {
  parent: sql
  name: 'Default'
  properties: {
    state: 'Enabled'
    disabledAlerts: []
    emailAccountAdmins: true
    retentionDays: 91
  }
}

resource database 'Microsoft.Sql/servers/databases@2023-08-01' = {
  //checkov:skip=CKV_AZURE_26: alerts go to the subscription's admins (emailAccountAdmins on the server's policy)
  //checkov:skip=CKV_AZURE_27: alerts go to the subscription's admins (emailAccountAdmins on the server's policy)
  //checkov:skip=CKV_AZURE_229: the Standard tier (S0 to S3) has no zone-redundant option; a Premium or vCore tier is the operator's choice
  parent: sql
  name: 'orders'
  location: location
  tags: tags
  sku: {
    name: sqlServiceObjective
    tier: 'Standard'
  }
}

// The database's own audit and threat detection, its audit records sent to
// the workspace by the diagnostic setting below.
resource databaseAuditing 'Microsoft.Sql/servers/databases/auditingSettings@2023-08-01' = {
  parent: database
  name: 'default'
  properties: {
    state: 'Enabled'
    isAzureMonitorTargetEnabled: true
    retentionDays: 91
  }
}

resource databaseAlerts 'Microsoft.Sql/servers/databases/securityAlertPolicies@2023-08-01' = {
  parent: database
  name: 'Default'
  properties: {
    state: 'Enabled'
    disabledAlerts: []
    emailAccountAdmins: true
    retentionDays: 91
  }
}

resource auditToWorkspace 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'audit-to-workspace'
  scope: database
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        category: 'SQLSecurityAuditEvents'
        enabled: true
      }
    ]
  }
}

resource redis 'Microsoft.Cache/redisEnterprise@2025-04-01' = {
  name: 'redis-${resourceToken}'
  location: location
  tags: tags
  sku: {
    name: 'Balanced_B0'
  }
  properties: {
    minimumTlsVersion: '1.2'
  }

  // EnterpriseCluster: one endpoint (REDIS_CLUSTER=false); NoEviction keeps
  // the guard's keys; Encrypted: TLS only.
  resource redisDatabase 'databases' = {
    name: 'default'
    properties: {
      clientProtocol: 'Encrypted'
      port: 10000
      clusteringPolicy: 'EnterpriseCluster'
      evictionPolicy: 'NoEviction'
      accessKeysAuthentication: 'Disabled'
    }

    // `default` is the only access policy Azure Managed Redis has. The
    // handler signs in with the identity's token and object id
    // (REDIS_AUTH=entra-id, REDIS_CLIENT_ID).
    resource app 'accessPolicyAssignments' = {
      name: 'orderguard'
      properties: {
        accessPolicyName: 'default'
        user: {
          objectId: identityPrincipalId
        }
      }
    }

    // The operator's own: `status` and `prune-guard` from their machine.
    // Names are letters and digits only.
    resource operator 'accessPolicyAssignments' = {
      name: 'op${uniqueString(adminObjectId)}'
      properties: {
        accessPolicyName: 'default'
        user: {
          objectId: adminObjectId
        }
      }
      dependsOn: [
        app
      ]
    }
  }
}

output sqlServerName string = sql.name
output sqlServerFqdn string = sql.properties.fullyQualifiedDomainName
output sqlDatabaseName string = database.name
output redisHostName string = redis.properties.hostName
