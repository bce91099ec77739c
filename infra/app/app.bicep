// The Function App running both functions of the package (OrderTrigger,
// DeadLetterSweep) on Flex Consumption (FC1, runtime `custom` 1.0, the
// package in a blob container the identity signs in to), the Functions
// host's own storage account (shared-key access off), and the app settings
// the handler reads, every client signing in as the user-assigned identity.
//
// Flex Consumption only, no Premium: with shared keys off a Premium app
// has no Azure Files content share, and an app without one runs its
// package only from the package's blob URL (WEBSITE_RUN_FROM_PACKAGE=<url>,
// read through the identity), not from the `1` that azd's zip deploy to
// Premium relies on (the package kept on the content share).
param name string
param resourceToken string
param location string
param tags object
param identityId string
param identityClientId string
param identityPrincipalId string
param appInsightsConnectionString string
param redisHostName string
param sqlServerFqdn string
param sqlDatabaseName string
@description('The database\'s max concurrent workers (its service objective\'s, main.bicep).')
param sqlMaxWorkers int
@description('The most instances Flex runs for a function (40 is the lowest most regions accept); more than the database holds at one connection each is lowered to that.')
param maximumInstanceCount int
param deadLetterStorage string
param outboxStorage string
param orderEventTypes array

// Storage Blob Data Owner: what the Functions host needs on its own
// account (AzureWebJobsStorage: the timer's schedule monitor and singleton
// lock, the host's keys and leases, all in Blob storage), and the Flex
// package container in it. The host uses the account's queues and tables
// only for triggers this app has none of (Durable Functions, queue and
// blob triggers; Microsoft's Flex samples set
// AzureWebJobsStorage__queueServiceUri and __tableServiceUri with Storage
// Queue Data Contributor and Storage Table Data Contributor for those), so
// neither URI is set here, and neither role is given.
var blobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
var packageContainer = 'app-package'

resource hostStorage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  //checkov:skip=CKV_AZURE_35: the app has no virtual network (Flex without VNet integration reaches it over its public endpoint); every request signs in with Entra ID, shared keys are off
  //checkov:skip=CKV_AZURE_59: the app has no virtual network (Flex without VNet integration reaches it over its public endpoint); every request signs in with Entra ID, shared keys are off
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

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  //checkov:skip=CKV_AZURE_225: zone redundancy on Flex Consumption depends on the region and bills always-ready instances; a choice for the operator, not a default
  name: 'plan-${resourceToken}'
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
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
  // Connections each instance opens at most: sized with the instance
  // count below.
  SQL_POOL_SIZE: '${sqlPoolSize}'
}

// Every instance's pool must fit in the database's max concurrent workers
// (a running statement takes one), less 10 for the operator's commands and
// the admin's `migrate`: (instances + 1) × SQL_POOL_SIZE ≤ workers − 10,
// the one more being DeadLetterSweep's (Flex scales a timer function on
// instances of its own, and Azure's API reference counts
// maximumInstanceCount per function group).
// Flex accepts no maximum below 40 in most regions, so 40 is the default:
// on S0 (60 workers) each instance then gets one connection (41 × 1 ≤ 50),
// on S3 (200) four; where Flex accepts fewer instances, fewer get more, up
// to the handler's default of 10 (4 instances on S0: 5 × 10 ≤ 50). One
// connection serves one store call at a time (each call takes its own),
// and at S0's 10 DTUs the database, not the pool, is what limits the rate.
var reservedSqlWorkers = 10
var instances = min(maximumInstanceCount, sqlMaxWorkers - reservedSqlWorkers - 1)
var sqlPoolSize = max(1, min(10, (sqlMaxWorkers - reservedSqlWorkers) / (instances + 1)))

// The Functions host's own: its storage by identity (Blob only, the role
// it holds), Application Insights by Entra ID (local authentication is off
// there).
var hostSettings = {
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identityClientId
  AzureWebJobsStorage__blobServiceUri: hostStorage.properties.primaryEndpoints.blob
  APPLICATIONINSIGHTS_CONNECTION_STRING: appInsightsConnectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'Authorization=AAD;ClientId=${identityClientId}'
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
    maximumInstanceCount: instances
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
  //checkov:skip=CKV_AZURE_212: Flex Consumption scales out on its own; a failed instance's events are redelivered by Event Grid
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
    // No FTPS state: Flex Consumption has no FTP (a package goes to the
    // blob container only), and Learn lists the property among Flex's
    // deprecations.
    siteConfig: {
      minTlsVersion: '1.2'
      http20Enabled: true
    }
    functionAppConfig: flexConfig
  }

  resource settings 'config' = {
    //checkov:skip=CKV_AZURE_66: appsettings is the map of settings, not the site's configuration, which checkov takes it for
    //checkov:skip=CKV_AZURE_63: appsettings is the map of settings, not the site's configuration, which checkov takes it for
    //checkov:skip=CKV_AZURE_222: appsettings is the map of settings, not the site's configuration, which checkov takes it for
    //checkov:skip=CKV_AZURE_80: appsettings is the map of settings, not the site's configuration, which checkov takes it for
    //checkov:skip=CKV_AZURE_13: appsettings is the map of settings, not the site's configuration; the functions are called by the host with its keys, App Service Authentication would refuse Event Grid
    //checkov:skip=CKV_AZURE_88: appsettings is the map of settings, not the site's configuration; the package runs from a blob container, no Azure Files
    //checkov:skip=CKV_AZURE_78: appsettings is the map of settings, not the site's configuration, which checkov takes it for
    //checkov:skip=CKV_AZURE_65: appsettings is the map of settings, not the site's configuration, which checkov takes it for
    name: 'appsettings'
    properties: union(handlerSettings, hostSettings)
  }

  dependsOn: [
    hostOnStorage
  ]
}

output id string = app.id
output name string = app.name
output maximumInstanceCount int = instances
output sqlPoolSize int = sqlPoolSize
