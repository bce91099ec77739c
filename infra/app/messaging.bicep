// The app's own storage (shared-key access off) with the dead-letter
// container and the announcements queue, each role at the narrowest scope
// its client uses, and the Event Grid topic orders are published to, with
// what its subscription to OrderTrigger needs: the identity on the topic
// and that identity's role on the container.
//
// The subscription itself is not made here: Event Grid checks that
// OrderTrigger exists when it is made, which is true only once the package
// is deployed. infra/hooks/postdeploy.sh makes it from the outputs below
// (EVENT_GRID_TOPIC_ID, AZURE_FUNCTION_APP_ID, AZURE_IDENTITY_ID,
// DEAD_LETTER_STORAGE_ACCOUNT_ID, DEAD_LETTER_CONTAINER_ID,
// ORDER_EVENT_TYPES), with a PUT of the eventSubscriptions API (the same
// call on every `azd up` changes nothing): `az rest`, since
// `az eventgrid event-subscription create` dead-letters only through a
// system-assigned identity (--deadletter-identity systemassigned), and the
// storage account, with shared keys off, takes Event Grid's writes only
// signed in. docs/deploy.md step 9 has the same call. Its settings:
//   name                 orders-to-guard
//   endpoint             AzureFunction, <app id>/functions/OrderTrigger,
//                        one event a batch (a batch is all-or-none in the
//                        handler)
//   event type filter    orderEventTypes (main.bicep; ORDER_EVENT_TYPES)
//   retry policy         30 attempts, events live 1440 min (a day)
//   dead letters         deadLetterWithResourceIdentity: the container
//                        below (deadletters) in this account, written
//                        through the user-assigned identity (on the topic),
//                        which holds Storage Blob Data Contributor on it
//                        (appOnContainer)
param resourceToken string
param location string
param tags object
@description('The account\'s name (main.bicep makes the app\'s settings from it).')
param storageName string
param identityId string
param identityPrincipalId string
@description('The operator: reads the queue, replays dead letters, publishes to the topic.')
param operatorPrincipalId string
@description('What the operator is: a user, or a service principal (a pipeline).')
@allowed([
  'User'
  'ServicePrincipal'
])
param operatorPrincipalType string

// The names the handler's settings default to (DEAD_LETTER_CONTAINER,
// OUTBOX_QUEUE): src/config/dead_letter.rs, src/config/outbox.rs.
var deadLetterContainer = 'deadletters'
var announcementsQueue = 'order-executed'

var blobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'
var queueDataMessageSender = 'c6a89b2d-59bc-44d0-9896-0f6e12d7b80a'
var queueDataContributor = '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
var eventGridDataSender = 'd5a91429-5739-47e2-a06b-3470a27159e7'

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  //checkov:skip=CKV_AZURE_35: the app has no virtual network (Flex without VNet integration reaches it over its public endpoint); every request signs in with Entra ID, shared keys are off; Event Grid dead-letters through its identity
  //checkov:skip=CKV_AZURE_59: the app has no virtual network (Flex without VNet integration reaches it over its public endpoint); every request signs in with Entra ID, shared keys are off
  //checkov:skip=CKV_AZURE_206: zone-redundant (ZRS); a region's loss takes the database (S0, not geo-replicated) too, so geo-replicating its dead letters alone would keep nothing whole
  //checkov:skip=CKV_AZURE_43: 'stdata' and uniqueString's 13 lowercase characters (main.bicep): 19 lowercase letters and digits, a name checkov cannot evaluate
  name: storageName
  location: location
  tags: tags
  kind: 'StorageV2'
  // Dead letters are orders not yet executed: kept across a zone's loss.
  sku: {
    name: 'Standard_ZRS'
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

    resource deadLetters 'containers' = {
      name: deadLetterContainer
      properties: {
        publicAccess: 'None'
      }
    }
  }

  resource queues 'queueServices' = {
    name: 'default'

    resource announcements 'queues' = {
      name: announcementsQueue
    }
  }
}

// DeadLetterSweep reads, copies and deletes the container's blobs; Event
// Grid writes them there through the same identity.
resource appOnContainer 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage::blobs::deadLetters.id, identityPrincipalId, blobDataContributor)
  scope: storage::blobs::deadLetters
  properties: {
    principalId: identityPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', blobDataContributor)
  }
}

// The outbox only adds messages.
resource appOnQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage::queues::announcements.id, identityPrincipalId, queueDataMessageSender)
  scope: storage::queues::announcements
  properties: {
    principalId: identityPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', queueDataMessageSender)
  }
}

resource operatorOnContainer 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage::blobs::deadLetters.id, operatorPrincipalId, blobDataContributor)
  scope: storage::blobs::deadLetters
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', blobDataContributor)
  }
}

// The operator reads announcements and sends with `outbox dispatch`.
resource operatorOnQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage::queues::announcements.id, operatorPrincipalId, queueDataContributor)
  scope: storage::queues::announcements
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', queueDataContributor)
  }
}

// Publishers sign in with Entra ID (local authentication off); the
// topic's identity is the app's, which the subscription dead-letters
// through.
resource topic 'Microsoft.EventGrid/topics@2025-02-15' = {
  //checkov:skip=CKV_AZURE_193: publishers outside a virtual network publish over the public endpoint, each signed in with Entra ID (local authentication off)
  name: 'evgt-orders-${resourceToken}'
  location: location
  tags: tags
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    inputSchema: 'EventGridSchema'
    disableLocalAuth: true
    minimumTlsVersionAllowed: '1.2'
    publicNetworkAccess: 'Enabled'
  }
}

// The smoke test (infra/hooks/postdeploy.sh) publishes as the operator.
resource operatorOnTopic 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(topic.id, operatorPrincipalId, eventGridDataSender)
  scope: topic
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', eventGridDataSender)
  }
}

output topicEndpoint string = topic.properties.endpoint
output topicName string = topic.name
output topicId string = topic.id
output deadLetterContainerId string = storage::blobs::deadLetters.id
output storageId string = storage.id
