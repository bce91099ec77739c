// The Function App running both functions of the package (OrderTrigger,
// DeadLetterSweep): Flex Consumption (FC1, runtime `custom` 1.0, the
// package in a blob container the identity signs in to) or Premium (EP1),
// the Functions host's own storage account (shared-key access off), and
// the app settings the handler reads, every client signing in as the
// user-assigned identity.
param name string
param resourceToken string
param location string
param tags object
@allowed([
  'FC1'
  'EP1'
])
param planSku string
param identityId string
param identityClientId string
param identityPrincipalId string
param appInsightsConnectionString string
param redisHostName string
param sqlServerFqdn string
param sqlDatabaseName string
param deadLetterStorage string
param outboxStorage string
param orderEventTypes array

var flex = planSku == 'FC1'
// Storage Blob Data Owner: what the Functions host needs on its own
// account (AzureWebJobsStorage: the timer's and the host's leases, keys),
// and the Flex package container in it.
var blobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
var packageContainer = 'app-package'

resource hostStorage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  //checkov:skip=CKV_AZURE_35: the app has no virtual network (Flex and Premium without VNet integration reach it over its public endpoint); every request signs in with Entra ID, shared keys are off
  //checkov:skip=CKV_AZURE_59: the app has no virtual network (Flex and Premium without VNet integration reach it over its public endpoint); every request signs in with Entra ID, shared keys are off
  //checkov:skip=CKV_AZURE_206: the host's leases and keys, rebuilt by the host; nothing of the app's data is kept here
  //checkov:skip=CKV_AZURE_43: 'sthost' and uniqueString's 13 lowercase characters: 19 lowercase letters and digits, a name checkov cannot evaluate
  name: 'sthost${resourceToken}'
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    allowSharedKeyAccess: false
    allowBlobPublicAccess: false
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    defaultToOAuthAuthentication: true
    publicNetworkAccess: 'Enabled'
  }

  resource blobs 'blobServices' = {
    name: 'default'
    properties: {
      deleteRetentionPolicy: {
        enabled: true
        days: 7
      }
    }

    resource package 'containers' = {
      name: packageContainer
      properties: {
        publicAccess: 'None'
      }
    }
  }
}

resource hostOnStorage 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(hostStorage.id, identityPrincipalId, blobDataOwner)
  scope: hostStorage
  properties: {
    principalId: identityPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', blobDataOwner)
  }
}

var flexSku = {
  name: 'FC1'
  tier: 'FlexConsumption'
}
var premiumSku = {
  name: 'EP1'
  tier: 'ElasticPremium'
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  //checkov:skip=CKV_AZURE_225: zone redundancy depends on the region and, on Premium, takes three always-ready instances; a choice for the operator, not a default
  name: 'plan-${resourceToken}'
  location: location
  tags: tags
  kind: flex ? 'functionapp' : 'elastic'
  sku: flex ? flexSku : premiumSku
  properties: {
    reserved: true
    maximumElasticWorkerCount: flex ? null : 20
  }
}

// Every setting the handler needs in Azure (src/config, docs/configuration.md).
var handlerSettings = {
  // The identity for the clients that name none of their own (Blob, Queue).
  AZURE_CLIENT_ID: identityClientId
  REDIS_URL: '${redisHostName}:10000,ssl=True'
  REDIS_AUTH: 'entra-id'
  REDIS_CLUSTER: 'false'
  REDIS_CLIENT_ID: identityClientId
  SQL_CONNECTION_STRING: 'Server=tcp:${sqlServerFqdn},1433;Initial Catalog=${sqlDatabaseName};Authentication=Active Directory Managed Identity;User ID=${identityClientId};Encrypt=True'
  ORDER_EVENT_TYPES: join(orderEventTypes, ',')
  DEAD_LETTER_STORAGE: deadLetterStorage
  // Read by the host for DeadLetterSweep (NCRONTAB with seconds); also
  // what sends the outbox on a plan scaled to zero.
  DEAD_LETTER_SWEEP_SCHEDULE: '0 */5 * * * *'
  OUTBOX_STORAGE: outboxStorage
}

// The Functions host's own: its storage by identity, Application Insights
// by Entra ID (local authentication is off there).
var hostSettings = {
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identityClientId
  AzureWebJobsStorage__blobServiceUri: hostStorage.properties.primaryEndpoints.blob
  AzureWebJobsStorage__queueServiceUri: hostStorage.properties.primaryEndpoints.queue
  AzureWebJobsStorage__tableServiceUri: hostStorage.properties.primaryEndpoints.table
  APPLICATIONINSIGHTS_CONNECTION_STRING: appInsightsConnectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'Authorization=AAD;ClientId=${identityClientId}'
}

// Premium's runtime is chosen by settings, which Flex refuses (its runtime
// is functionAppConfig.runtime).
var premiumSettings = {
  FUNCTIONS_EXTENSION_VERSION: '~4'
  FUNCTIONS_WORKER_RUNTIME: 'custom'
  WEBSITE_RUN_FROM_PACKAGE: '1'
}

// Flex's own configuration: the package container (signed in to with the
// identity), the scale, and the runtime (a custom handler: `custom` 1.0).
var flexConfig = {
  deployment: {
    storage: {
      type: 'blobContainer'
      value: '${hostStorage.properties.primaryEndpoints.blob}${packageContainer}'
      authentication: {
        type: 'UserAssignedIdentity'
        userAssignedIdentityResourceId: identityId
      }
    }
  }
  scaleAndConcurrency: {
    instanceMemoryMB: 2048
    maximumInstanceCount: 100
  }
  runtime: {
    name: 'custom'
    version: '1.0'
  }
}
var appTags = union(tags, { 'azd-service-name': 'api' })

resource app 'Microsoft.Web/sites@2024-04-01' = {
  //checkov:skip=CKV_AZURE_222: Event Grid delivers to OrderTrigger over the public endpoint (the host's Event Grid webhook, signed with its system key)
  //checkov:skip=CKV_AZURE_17: Event Grid presents no client certificate
  //checkov:skip=CKV_AZURE_212: Flex Consumption and Premium scale out on their own; a failed instance's events are redelivered by Event Grid
  //checkov:skip=CKV_AZURE_213: a Functions app has no health-check path of its own; the host restarts a handler that does not start
  name: name
  location: location
  tags: appTags
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    keyVaultReferenceIdentity: identityId
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
    }
    functionAppConfig: flex ? flexConfig : null
  }

  resource settings 'config' = {
    //checkov:skip=CKV_AZURE_66: appsettings is the map of settings, not the site's configuration, which checkov takes it for
    //checkov:skip=CKV_AZURE_63: appsettings is the map of settings, not the site's configuration, which checkov takes it for
    //checkov:skip=CKV_AZURE_222: appsettings is the map of settings, not the site's configuration, which checkov takes it for
    //checkov:skip=CKV_AZURE_80: appsettings is the map of settings, not the site's configuration, which checkov takes it for
    //checkov:skip=CKV_AZURE_13: appsettings is the map of settings, not the site's configuration; the functions are called by the host with its keys, App Service Authentication would refuse Event Grid
    //checkov:skip=CKV_AZURE_88: appsettings is the map of settings, not the site's configuration; the package runs from a blob container, no Azure Files
    //checkov:skip=CKV_AZURE_65: appsettings is the map of settings, not the site's configuration, which checkov takes it for
    name: 'appsettings'
    properties: union(handlerSettings, hostSettings, flex ? {} : premiumSettings)
  }

  dependsOn: [
    hostOnStorage
  ]
}

output id string = app.id
output name string = app.name
